"""Leave a process without Python's teardown of its modules.

With torch loaded (and torch._dynamo, which a process's first optimizer imports), the
interpreter's teardown takes over a second on a small CPU, after everything that matters
is done: a `fedqueue run` that has printed its summary, a worker that has stopped. This
exit does what a normal one must (wait for non-daemon threads, run atexit handlers,
flush stdout and stderr) and skips the rest. Where this Python lacks the hooks it needs,
it exits the normal way.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
import threading
from collections.abc import Callable
from typing import NoReturn


def exit_code(code: str | int | None) -> int:
    """The status `sys.exit(code)` would end with; a message is printed to stderr, as it would be."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def exit_now(code: str | int | None = 0) -> NoReturn:
    wait_for_threads = getattr(threading, "_shutdown", None)
    run_atexit = getattr(atexit, "_run_exitfuncs", None)
    if wait_for_threads is None or run_atexit is None:
        sys.exit(code)
    status = exit_code(code)
    # What the interpreter does first at exit: join non-daemon threads (a thread pool's too).
    wait_for_threads()
    run_atexit()  # logging's flush, temporary folders' removal, ...
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a closed pipe or stream: nothing left to write to
            stream.flush()
    os._exit(status)


def run_then_exit(main: Callable[[], object]) -> NoReturn:
    """Call `main()` (a command that may end with sys.exit), then leave with its status."""
    try:
        main()
    except SystemExit as done:
        exit_now(done.code)
    exit_now(0)
