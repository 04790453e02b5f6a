"""Poison messages: whatever a queue holds that is not a task this worker can run is dead-lettered once.

kombu's Redis transport pops a message and parses it in one step; raw bytes that are not an envelope
(plain text, binary, a bare `42`, a body that is not valid base64) raise out of its event loop, and Celery
ends the worker with "Unrecoverable error". The channel below parses first and dead-letters what fails, so
the worker reads on. Envelopes Celery itself cannot use (a body it cannot decode, no task header, a task it
does not know) are dead-lettered by the consumer's own hooks, then handled as Celery handles them.
"""

from __future__ import annotations

from queue import Empty
from typing import Any

import redis
from kombu.transport import redis as kombu_redis
from kombu.utils.encoding import bytes_to_str
from kombu.utils.json import loads

from fedqueue.core.broker.dead_letters import dead_letter
from fedqueue.queue.consumer import Consumer as BackingOffConsumer


def dead_letter_on(channel: Any, queue: str, why: str, body: Any) -> None:
    """Dead-letter through a kombu Redis channel's own connections, under the deployment's prefix."""
    prefix = str(getattr(channel, "global_keyprefix", "") or "").removesuffix(":")
    dead_letter(redis.Redis(connection_pool=channel.pool), prefix, queue, why, body)


class DeadLetteringChannel(kombu_redis.Channel):
    def _brpop_read(self, **options: Any) -> bool:
        # kombu's own, but for the envelope: checked before it is delivered (see the module's docstring).
        try:
            try:
                dest__item = self.client.parse_response(self.client.connection, "BRPOP", **options)
            except self.connection_errors:
                self.client.connection.disconnect()  # the next iteration connects again
                raise
            if not dest__item:
                raise Empty()
            dest, item = dest__item
            dest = bytes_to_str(dest).rsplit(self.sep, 1)[0]  # type: ignore[no-untyped-call]
            self._queue_cycle.rotate(dest)
            envelope = self._envelope(dest, item)
            if envelope is not None:
                self.connection._deliver(envelope, dest)
            return True
        finally:
            self._in_poll = None  # type: ignore[assignment]
            self._flush_brpop_reauth()  # type: ignore[no-untyped-call]

    def _envelope(self, queue: str, item: bytes) -> Any:
        """The parsed envelope, or None once one that is not is dead-lettered."""
        try:
            payload = loads(bytes_to_str(item))  # type: ignore[no-untyped-call]
            self.Message(payload, channel=self)  # type: ignore[no-untyped-call]  # raises on what is not one
        except Exception as err:  # noqa: BLE001 - whatever the bytes are, they are not a message
            dead_letter_on(self, queue, f"not a message envelope ({type(err).__name__}: {err})", item)
            return None
        return payload


class Consumer(BackingOffConsumer):
    """Celery's consumer (reconnecting with backoff), dead-lettering the envelopes it refuses before refusing
    them as it does."""

    def on_decode_error(self, message: Any, exc: Exception) -> None:
        _dead_letter_message(message, f"body cannot be decoded ({type(exc).__name__}: {exc})")
        super().on_decode_error(message, exc)

    def on_unknown_message(self, body: Any, message: Any) -> None:
        _dead_letter_message(message, "not a task message (no task header)")
        super().on_unknown_message(body, message)

    def on_unknown_task(self, body: Any, message: Any, exc: Exception) -> None:
        _dead_letter_message(message, f"unknown task {exc}")
        super().on_unknown_task(body, message, exc)

    def on_invalid_task(self, body: Any, message: Any, exc: Exception) -> None:
        _dead_letter_message(message, f"invalid task message ({exc})")
        super().on_invalid_task(body, message, exc)


def _dead_letter_message(message: Any, why: str) -> None:
    info = getattr(message, "delivery_info", None) or {}
    queue = str(info.get("routing_key") or info.get("exchange") or "?")
    dead_letter_on(message.channel, queue, why, getattr(message, "body", b""))
