"""The `fedqueue` command as the tests run it: `python -m fedqueue.cli` in a process of its own."""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

# The command line that starts `fedqueue` with this Python, for a caller that wraps it in another command.
FEDQUEUE_CLI = (sys.executable, "-m", "fedqueue.cli")


def fedqueue_cli(
    *args: str,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    timeout: float = 60,
    input: str | None = None,
) -> subprocess.CompletedProcess[str]:
    """`fedqueue *args` run to its end, its stdout and stderr captured as text; env None is this process's."""
    return subprocess.run(
        [*FEDQUEUE_CLI, *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout, input=input
    )


def interruptible() -> None:
    """In a child before it starts: Ctrl-C (SIGINT) acts as it does in a terminal's foreground. A shell that
    runs the tests in the background (`cmd &`, no job control) starts them with SIGINT ignored, which Python
    then keeps: a test that interrupts a command would see it carry on."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def start_fedqueue_cli(
    *args: str,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    stdout: int | IO[Any] | None = None,
    stderr: int | IO[Any] | None = None,
) -> subprocess.Popen[str]:
    """`fedqueue *args` started and left running (a launcher, a worker, Flower); pipes asked for carry text.
    Ctrl-C reaches it as in a terminal (`interruptible`)."""
    return subprocess.Popen(
        [*FEDQUEUE_CLI, *args], env=env, cwd=cwd, stdout=stdout, stderr=stderr, text=True, preexec_fn=interruptible
    )
