"""Celery's consumer, reconnecting with backoff and never leaving a connection open behind it.

Celery's consumer restarts at once after a connection error (a second or so only after five in a second),
and a connection that failed after it was made but before the consumer held it (while it joined the event
loop) is never closed. Against a Redis that answers PING but refuses writes (at its maxmemory), that was a
new connection every 80 ms, each kept with its socket, until Redis refused every client. Here each restart
waits, from 1 s doubling to 30 s (back to 1 s after a minute without error), and a connection that failed
while being set up is closed before the next one is made.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from celery.worker.consumer import Consumer as CeleryConsumer
from kombu.common import ignore_errors

from fedqueue.queue.stopping import worker_stopping

log = logging.getLogger(__name__)

FIRST_PAUSE_S = 1.0
MAX_PAUSE_S = 30.0
CALM_S = 60.0  # a connection error this long after the last one starts the backoff afresh
STOP_CHECK_S = 0.2  # how soon a pause notices that its worker is asked to stop


class Consumer(CeleryConsumer):
    _pause_s = 0.0
    _last_error = float("-inf")

    def connect(self) -> Any:
        conn = self.connection_for_read(heartbeat=self.amqheartbeat)
        try:
            if self.hub:
                conn.transport.register_with_event_loop(conn.connection, self.hub)
        except BaseException:
            # Not yet the consumer's: Celery would leave it open.
            ignore_errors(conn, conn.close)  # type: ignore[no-untyped-call]
            raise
        return conn

    def on_connection_error_before_connected(self, exc: BaseException) -> None:
        super().on_connection_error_before_connected(exc)
        self._back_off()

    def on_connection_error_after_connected(self, exc: BaseException) -> None:
        super().on_connection_error_after_connected(exc)
        self._back_off()

    def _back_off(self) -> None:
        now = time.monotonic()
        calm = now - self._last_error >= CALM_S
        self._pause_s = FIRST_PAUSE_S if calm else min(max(self._pause_s * 2, FIRST_PAUSE_S), MAX_PAUSE_S)
        log.warning("consumer: reconnecting in %.0f s", self._pause_s)
        while time.monotonic() - now < self._pause_s and not worker_stopping():
            time.sleep(STOP_CHECK_S)
        self._last_error = time.monotonic()
