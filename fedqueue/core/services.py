"""The connections one process holds: store, blob store, Redis. Opened once, shared by threads."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any

import redis

from fedqueue.config import Settings, mask_url
from fedqueue.core import keys
from fedqueue.core.blobs import BlobStore, DirBlobStore, RedisBlobStore
from fedqueue.core.heartbeats import Heartbeats
from fedqueue.errors import ConfigError, ServiceUnavailable
from fedqueue.store import Store, open_store

# Sends task messages (any kind's) to their queues; see `fedqueue.queue.publish`.
Enqueue = Callable[[Sequence[Any]], None]
# The workers answering now, by hostname, with their concurrent task slots (the queue asks Celery).
WorkerSlots = Callable[[], dict[str, int]]


def no_workers_known() -> dict[str, int]:
    return {}


def connect_redis(url: str) -> redis.Redis:
    """A client for the broker's Redis, checked with a ping that fails within seconds."""
    if not url.startswith(("redis://", "rediss://", "unix://")):
        raise ConfigError(f"FEDQUEUE_BROKER_URL: expected a redis:// URL, got {mask_url(url)}")
    client = redis.Redis.from_url(url, socket_connect_timeout=3, socket_timeout=30, health_check_interval=30)
    try:
        client.ping()
    except redis.RedisError as err:
        raise ServiceUnavailable(f"broker {mask_url(url)} is unreachable: {err}") from None
    return client


@dataclass
class Services:
    """Store, blobs, Redis and the publisher of one process.

    Tasks are named by their `attempt_key` (a kind's own string, such as
    `run:round:device`): attempts, running marks and requeue marks live in Redis
    under the keys of `fedqueue.core.keys`.
    """

    settings: Settings
    store: Store
    blobs: BlobStore
    redis: redis.Redis
    enqueue: Enqueue
    worker_slots: WorkerSlots = no_workers_known
    _heartbeats: Heartbeats = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._heartbeats = Heartbeats(self.redis, self.settings.heartbeat_ttl_s)

    def _key(self, family: Callable[[str, str], str], task_key: str) -> str:
        return family(self.settings.key_prefix, task_key)

    def start_attempt(self, task_key: str, worker: str) -> int:
        """Count this delivery of a task and mark it running, in one atomic call.

        Both in one transaction: a scheduler that sees the attempt counted also sees the
        task running, so it never takes a task that is just starting for a lost one.
        The count lives in Redis, so it survives the worker crashing.
        """
        attempts = self._key(keys.attempts, task_key)
        with self.redis.pipeline(transaction=True) as pipe:
            pipe.incr(attempts)
            pipe.expire(attempts, self.settings.blob_ttl_s)
            pipe.set(self._key(keys.running, task_key), worker, ex=self.settings.heartbeat_ttl_s)
            count, _, _ = pipe.execute()
        return int(count)

    def take_back_attempt(self, task_key: str) -> None:
        """This delivery gave its work back undone (it waited for something that did not come): do not count it."""
        attempts = self._key(keys.attempts, task_key)
        if self.redis.decr(attempts) < 0:
            self.redis.set(attempts, 0, ex=self.settings.blob_ttl_s)

    def heartbeat(self, task_key: str, worker: str) -> AbstractContextManager[None]:
        """Keep the running mark of a started task alive while the block runs.

        The mark expires `heartbeat_ttl_s` after its worker dies, which is how a scheduler
        tells a lost task from a running one. It is left to expire after the block too: a
        stored result outranks a running mark, and deleting it would cost a round trip per task.
        """
        return self._heartbeats.beating(self._key(keys.running, task_key), worker)

    def hold(self, task_key: str, worker: str) -> None:
        """Keep a task marked as running for one heartbeat period (a retry is on its way)."""
        self.redis.set(self._key(keys.running, task_key), worker, ex=self.settings.heartbeat_ttl_s)

    def _many(self, family: Callable[[str, str], str], task_keys: Sequence[str]) -> list[bytes | None]:
        if not task_keys:
            return []
        values: list[bytes | None] = self.redis.mget([self._key(family, task_key) for task_key in task_keys])  # type: ignore[assignment]
        return values

    def attempts_of(self, task_keys: Sequence[str]) -> dict[str, int]:
        return {
            key: int(value or 0) for key, value in zip(task_keys, self._many(keys.attempts, task_keys), strict=True)
        }

    def running_of(self, task_keys: Sequence[str]) -> dict[str, bool]:
        return {
            key: value is not None for key, value in zip(task_keys, self._many(keys.running, task_keys), strict=True)
        }

    def requeued_of(self, task_keys: Sequence[str]) -> dict[str, int | None]:
        values = self._many(keys.requeued, task_keys)
        return {key: None if value is None else int(value) for key, value in zip(task_keys, values, strict=True)}

    def mark_requeued(self, task_key: str, attempts: int) -> None:
        self.redis.set(self._key(keys.requeued, task_key), attempts, ex=self.settings.blob_ttl_s)

    def mark_timed_out(self, task_key: str) -> None:
        """Note that a delivery of this task ran past the time limit (its worker is about to end itself)."""
        self.redis.set(
            self._key(keys.timed_out, task_key), self.settings.task_time_limit_s, ex=self.settings.blob_ttl_s
        )

    def lost_reason(self, task_key: str, attempts: int) -> str:
        """Why a task whose every attempt vanished with its worker is given up on."""
        limit = self.redis.get(self._key(keys.timed_out, task_key))
        if limit is not None:
            return f"time limit exceeded ({int(limit)} s) on each of {attempts} attempts"
        return f"worker lost during each of {attempts} attempts (crashed or killed)"

    def broker_id(self) -> str:
        """Redis's own run_id: it changes when the server restarts (and, without persistence, forgets everything)."""
        return str(self.redis.info("server")["run_id"])

    def queue_length(self, queue: str) -> int:
        """Messages waiting on one of the queues (by suffix), not those delivered and unacknowledged."""
        return int(self.redis.llen(keys.queue_list(self.settings.key_prefix, self.settings.queue(queue))))

    def stranded_long_enough(self, task_key: str) -> bool:
        """Note a task seen neither queued, running nor done; True once it was seen so a heartbeat ago.

        Such a message was delivered to a worker that died before starting it: it waits
        unacknowledged until the visibility timeout. Two sightings a heartbeat apart rule
        out a worker that had only just taken it.
        """
        key = self._key(keys.stranded, task_key)
        now = time.time()
        if self.redis.set(key, now, nx=True, ex=self.settings.heartbeat_ttl_s * 10):
            return False
        first_seen = float(self.redis.get(key) or now)
        if now - first_seen < self.settings.heartbeat_ttl_s:
            return False
        self.redis.delete(key)
        return True

    def mark_enqueued(self, group_key: str) -> None:
        """Every task of a group (a round, a batch plan) is on the queue: written after the last one was sent."""
        self.redis.set(self._key(keys.enqueued, group_key), 1, ex=self.settings.blob_ttl_s)

    def was_enqueued(self, group_key: str) -> bool:
        return bool(self.redis.exists(self._key(keys.enqueued, group_key)))

    def request_once(self, task_key: str, within_s: float) -> bool:
        """True for the first caller in `within_s` seconds: keeps repair passes from sending a task again and again."""
        return bool(self.redis.set(self._key(keys.requested, task_key), 1, nx=True, ex=max(1, int(within_s))))

    def renew_request(self, task_key: str, within_s: float) -> None:
        """Keep a request marked for `within_s` more seconds (its task is still at work on it)."""
        self.redis.expire(self._key(keys.requested, task_key), max(1, int(within_s)))

    def is_requested(self, task_key: str) -> bool:
        """A request of this task is marked (made and not yet taken up)."""
        return bool(self.redis.exists(self._key(keys.requested, task_key)))

    def reset_attempts(self, task_key: str) -> None:
        """A task run again and again (a run's fold pass) counts only its failures in a row."""
        self.redis.delete(self._key(keys.attempts, task_key))

    def forget_request(self, task_key: str) -> None:
        """The next `request_once` of this task goes through."""
        self.redis.delete(self._key(keys.requested, task_key))

    def attempts(self, task_key: str) -> int:
        """How many deliveries of this task have started so far."""
        return int(self.redis.get(self._key(keys.attempts, task_key)) or 0)

    def close(self) -> None:
        self.store.close()
        self.redis.close()


def open_services(
    settings: Settings, enqueue: Enqueue, *, migrate: bool, worker_slots: WorkerSlots = no_workers_known
) -> Services:
    if not settings.broker_url:
        raise ConfigError("FEDQUEUE_BROKER_URL: not set")
    client = connect_redis(settings.broker_url)
    store = open_store(settings.database_url, migrate=migrate)
    blobs: BlobStore
    if settings.blob_dir:
        blobs = DirBlobStore(settings.blob_dir)
    else:
        blobs = RedisBlobStore(client, settings.key_prefix, settings.blob_ttl_s)
    return Services(
        settings=settings, store=store, blobs=blobs, redis=client, enqueue=enqueue, worker_slots=worker_slots
    )
