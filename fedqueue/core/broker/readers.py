"""Which queues a worker reads: marks each worker process keeps in Redis, read by followers without Celery.

Celery knows its consumers only by asking them (a broadcast, then a wait for answers), which would load
Celery into every follower. Instead each worker process keeps its hostname in a sorted set per queue it
consumes, scored by when the mark runs out on the broker's clock (so hosts' clocks never matter), and a
thread of its own renews the marks every third of their TTL. A worker that stops removes its marks; one
that dies lets them run out. A follower counts the marks not yet run out.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from fedqueue.core.broker import keys

log = logging.getLogger(__name__)


def broker_now(client: redis.Redis) -> float:
    """The broker's clock, in seconds."""
    seconds, microseconds = client.time()
    return float(seconds) + microseconds / 1e6


class ReaderMarks:
    """One worker process's marks on the queues it consumes, kept alive by a daemon thread until `stop`."""

    def __init__(self, client: redis.Redis, prefix: str, queues: Sequence[str], hostname: str, ttl_s: float) -> None:
        self._client = client
        self._keys = [keys.queue_readers(prefix, queue) for queue in queues]
        self._hostname = hostname
        self._ttl_s = ttl_s
        self._stopped = threading.Event()
        self._failing = False

    def start(self) -> ReaderMarks:
        self._mark()  # at once: a follower sees the worker as soon as it consumes
        threading.Thread(target=self._renew_forever, name="fedqueue-reader-marks", daemon=True).start()
        return self

    def stop(self) -> None:
        """Remove the marks: this worker reads no more (a worker that cannot reach the broker lets them run out)."""
        self._stopped.set()
        try:
            with self._client.pipeline(transaction=False) as pipe:
                for key in self._keys:
                    pipe.zrem(key, self._hostname)
                pipe.execute()
        except redis.RedisError as err:
            log.info("queue reader marks not removed (%s); they run out by themselves", err)

    def _renew_forever(self) -> None:
        while not self._stopped.wait(self._ttl_s / 3):
            self._mark()

    def _mark(self) -> None:
        try:
            now = broker_now(self._client)
            with self._client.pipeline(transaction=False) as pipe:
                for key in self._keys:
                    pipe.zadd(key, {self._hostname: now + self._ttl_s})
                    pipe.zremrangebyscore(key, "-inf", now)  # workers that died: their marks ran out
                    pipe.expire(key, int(self._ttl_s * 2) + 1)  # the whole set goes once no worker renews it
                pipe.execute()
            if self._failing:
                log.info("queue reader marks written again")
            self._failing = False
        except redis.RedisError as err:
            if not self._failing:  # once per outage: Celery says the rest about a broker that went
                log.warning("queue reader marks not written (%s); followers may say no worker reads", err)
            self._failing = True


@dataclass(frozen=True)
class QueueLook:
    """A queue as a follower sees it: messages waiting on it, worker processes reading it."""

    queue: str
    waiting: int
    readers: int


def look(client: redis.Redis, prefix: str, queues: Sequence[str]) -> list[QueueLook]:
    """Each queue's waiting messages and live readers (marks not run out), in one round trip after the clock's."""
    now = broker_now(client)
    with client.pipeline(transaction=False) as pipe:
        for queue in queues:
            pipe.llen(keys.queue_list(prefix, queue))
            pipe.zcount(keys.queue_readers(prefix, queue), now, "+inf")
        counts = pipe.execute()
    return [QueueLook(queue, int(counts[2 * index]), int(counts[2 * index + 1])) for index, queue in enumerate(queues)]


def looker(url: str, prefix: str) -> Callable[[Sequence[str]], list[QueueLook]]:
    """`look` on a connection of its own per look, tried once: a broker that is down raises at once."""

    def looked(queues: Sequence[str]) -> list[QueueLook]:
        client = redis.Redis.from_url(url, socket_connect_timeout=2, socket_timeout=5, retry=Retry(NoBackoff(), 0))
        try:
            return look(client, prefix, queues)
        finally:
            client.close()

    return looked
