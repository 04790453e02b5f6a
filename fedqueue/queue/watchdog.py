"""Enforces the task time limit in a worker process: threads cannot be stopped, a process can.

Celery's threads pool ignores time limits. A task past its deadline gets its
`on_timeout` called (mark it, store its failure if that was its last attempt),
then the whole process ends with TIMEOUT_EXIT_CODE; the launcher starts it
again and the run's repair pass sends the lost tasks again.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator

log = logging.getLogger(__name__)

# Distinct from a crash: a launcher restarts such a worker without counting it as failing to start.
TIMEOUT_EXIT_CODE = 75


class Watchdog:
    def __init__(self, limit_s: float, exit_process: Callable[[int], object] = os._exit, poll_s: float = 0.25) -> None:
        self.limit_s = limit_s
        self._exit_process = exit_process
        self._poll_s = poll_s
        self._lock = threading.Lock()
        self._watched: dict[int, tuple[float, str, Callable[[], None]]] = {}
        self._ids = itertools.count()
        self._thread: threading.Thread | None = None

    @contextlib.contextmanager
    def watching(self, what: str, on_timeout: Callable[[], None]) -> Iterator[None]:
        """Run the block under the time limit; past it, `on_timeout` runs and the process ends."""
        token = next(self._ids)
        with self._lock:
            self._watched[token] = (time.monotonic() + self.limit_s, what, on_timeout)
            if self._thread is None:
                self._thread = threading.Thread(target=self._watch_forever, name="fedqueue-watchdog", daemon=True)
                self._thread.start()
        try:
            yield
        finally:
            with self._lock:
                self._watched.pop(token, None)

    def _watch_forever(self) -> None:
        while True:
            time.sleep(self._poll_s)
            now = time.monotonic()
            with self._lock:
                expired = [entry for entry in self._watched.values() if entry[0] <= now]
            if not expired:
                continue
            for _, what, on_timeout in expired:
                log.error("%s ran past the time limit of %.0f s: ending this worker process", what, self.limit_s)
                try:
                    on_timeout()
                except Exception:  # the process ends either way; the repair pass takes over
                    log.exception("could not record the time-out of %s", what)
            self._exit_process(TIMEOUT_EXIT_CODE)
            return
