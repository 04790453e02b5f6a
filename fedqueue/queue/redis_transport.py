"""kombu's Redis transport, made to wait out a Redis at its maxmemory instead of failing on it.

A Redis that is full (filled by someone else: fedqueue keeps its own blobs under half of maxmemory) refuses
every write that may grow it with an out-of-memory reply, and only those: reads, deletes, BRPOP and PING
still work. kombu writes on every delivery (the unacked hash), every late ack and reject (a MULTI/EXEC, which
a full Redis refuses whole), every declared queue (its binding) and every reply. Left as they are:

- a refused ack is logged ("Couldn't ack") and dropped, and the channel keeps the message as held: with a
  prefetch of one the worker never takes another task, and the run stands still;
- a refused delivery has already taken the message off its queue;
- a refusal while the consumer starts is a channel error Celery counts as fatal.

Here each of those writes waits for room, with backoff, in the thread that makes it (a task's own thread for
its ack, the consumer for a delivery), up to the broker wait (FEDQUEUE_BROKER_WAIT_S), or until the worker is
asked to stop. The periodic sweep for expired deliveries is skipped while Redis is full. What still fails
(past the wait) is counted as a lost connection, which the consumer (fedqueue.queue.consumer) retries with
backoff; Celery's `broker_channel_error_retry` would retry every reply error, and with it a worker whose
broker is gone never finishes its warm stop.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from functools import partial
from typing import Any, TypeVar

import redis
from kombu.transport import TRANSPORT_ALIASES, virtual
from kombu.transport import redis as kombu_redis

from fedqueue.queue.poison import DeadLetteringChannel
from fedqueue.queue.stopping import worker_stopping

log = logging.getLogger(__name__)

ALIAS = "redis"
FIRST_PAUSE_S = 0.25  # a write refused for want of memory tries again after this, doubled each time ...
MAX_PAUSE_S = 5.0  # ... up to this
DEFAULT_ROOM_WAIT_S = 600.0  # how long a write waits for room unless the transport options say (room_wait_s)

T = TypeVar("T")
OutOfMemory = redis.exceptions.OutOfMemoryError


def when_room(
    what: str,
    write: Callable[[], T],
    wait_s: float,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> T:
    """`write()`, tried again with a growing pause while Redis refuses it for want of memory.

    Raises the last refusal past `wait_s`, or at once when the worker is stopping.
    """
    began = clock()
    pause = FIRST_PAUSE_S
    while True:
        try:
            result = write()
        except OutOfMemory:
            waited = clock() - began
            if waited >= wait_s or worker_stopping():
                raise
            if pause == FIRST_PAUSE_S:
                log.warning("broker out of memory: %s waits for room (up to %.0f s)", what, wait_s)
            sleep(min(pause, max(wait_s - waited, 0.0)))
            pause = min(pause * 2, MAX_PAUSE_S)
            continue
        if pause > FIRST_PAUSE_S:
            log.warning("broker has room again: %s went through after %.0f s", what, clock() - began)
        return result


class QoS(kombu_redis.QoS):
    """Deliveries, acks and rejects that wait for room; the sweep for expired deliveries skipped while full."""

    channel: Channel

    def append(self, message: Any, delivery_tag: str) -> None:
        # The message is already off its queue: refused here, it would be lost until a repair pass sends it again.
        when_room(f"delivery {delivery_tag}", partial(super().append, message, delivery_tag), self._wait_s)

    def ack(self, delivery_tag: str) -> None:
        try:
            when_room(f"ack of {delivery_tag}", partial(super().ack, delivery_tag), self._wait_s)
        except OutOfMemory as err:
            self._let_go(delivery_tag, err)

    def reject(self, delivery_tag: str, requeue: bool = False) -> None:
        try:
            when_room(
                f"requeue of {delivery_tag}" if requeue else f"reject of {delivery_tag}",
                partial(super().reject, delivery_tag, requeue=requeue),
                self._wait_s,
            )
        except OutOfMemory as err:
            self._let_go(delivery_tag, err)

    def restore_visible(self, start: int = 0, num: int = 10, interval: int = 10) -> None:
        try:
            super().restore_visible(start, num, interval)  # type: ignore[no-untyped-call]
        except OutOfMemory:
            log.debug("broker out of memory: expired deliveries are restored at a later sweep")

    def _let_go(self, delivery_tag: str, err: Exception) -> None:
        """No room came: the channel stops holding the message (so the worker takes others), which stays in
        Redis's unacked hash and is delivered again after the visibility timeout (a task's result is stored once)."""
        log.error("%s still refused (%s): delivered again after the visibility timeout", delivery_tag, err)
        virtual.QoS.ack(self, delivery_tag)  # type: ignore[no-untyped-call]

    @property
    def _wait_s(self) -> float:
        return float(self.channel.room_wait_s)


class Channel(DeadLetteringChannel):
    """A Redis channel whose writes wait for room (see the module's docstring), and that dead-letters raw bytes
    that are not a message (fedqueue.queue.poison)."""

    QoS = QoS
    from_transport_options = (*kombu_redis.Channel.from_transport_options, "room_wait_s")  # type: ignore[assignment]
    room_wait_s: float = DEFAULT_ROOM_WAIT_S

    def _put(self, queue: str, message: Any, **kwargs: Any) -> None:
        # A batched publish only adds to its pipeline here; its flush is waited by the caller (fedqueue.queue.publish).
        when_room(f"a message to {queue}", partial(super()._put, queue, message, **kwargs), self.room_wait_s)

    def _queue_bind(self, exchange: str, routing_key: str, pattern: str, queue: str) -> None:
        when_room(
            f"binding queue {queue}",
            partial(super()._queue_bind, exchange, routing_key, pattern, queue),
            self.room_wait_s,
        )


class Transport(kombu_redis.Transport):
    Channel = Channel
    # Past its wait, a refusal is a lost connection (retried by the consumer), not an unrecoverable error.
    connection_errors = (*kombu_redis.Transport.connection_errors, OutOfMemory)


def use_for_redis_urls() -> None:
    """Make `redis://` broker URLs in this process use this transport (kombu picks it by the URL's scheme)."""
    TRANSPORT_ALIASES[ALIAS] = f"{__name__}:Transport"
