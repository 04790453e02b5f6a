"""The connections one process holds: store, blob store, Redis. Opened once, shared by threads."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import ContextManager

import redis

from fedqueue.blobs import BlobStore, DirBlobStore, RedisBlobStore
from fedqueue.config import Settings, mask_url
from fedqueue.errors import ConfigError, ServiceUnavailable
from fedqueue.heartbeats import Heartbeats
from fedqueue.messages import DeviceTask
from fedqueue.store import Store, open_store

Enqueue = Callable[[Sequence[DeviceTask]], None]


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
    settings: Settings
    store: Store
    blobs: BlobStore
    redis: redis.Redis
    enqueue: Enqueue
    _heartbeats: Heartbeats = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._heartbeats = Heartbeats(self.redis, self.settings.heartbeat_ttl_s)

    def _key(self, kind: str, run_id: str, round_index: int, device: int) -> str:
        return f"{self.settings.key_prefix}:{kind}:{run_id}:{round_index}:{device}"

    def _attempt_key(self, run_id: str, round_index: int, device: int) -> str:
        return self._key("attempts", run_id, round_index, device)

    def start_attempt(self, run_id: str, round_index: int, device: int, worker: str) -> int:
        """Count this delivery of a device task and mark it running, in one atomic call.

        Both in one transaction: a scheduler that sees the attempt counted also sees the
        task running, so it never takes a task that is just starting for a lost one.
        The count lives in Redis, so it survives the worker crashing.
        """
        attempts = self._attempt_key(run_id, round_index, device)
        with self.redis.pipeline(transaction=True) as pipe:
            pipe.incr(attempts)
            pipe.expire(attempts, self.settings.blob_ttl_s)
            pipe.set(self._key("running", run_id, round_index, device), worker, ex=self.settings.heartbeat_ttl_s)
            count, _, _ = pipe.execute()
        return int(count)

    def heartbeat(self, run_id: str, round_index: int, device: int, worker: str) -> ContextManager[None]:
        """Keep the running mark of a started task alive while the block runs.

        The mark expires `heartbeat_ttl_s` after its worker dies, which is how a scheduler
        tells a lost task from a running one. It is left to expire after the block too: a
        stored result outranks a running mark, and deleting it would cost a round trip per task.
        """
        return self._heartbeats.beating(self._key("running", run_id, round_index, device), worker)

    def hold(self, run_id: str, round_index: int, device: int, worker: str) -> None:
        """Keep a device marked as running for one heartbeat period (a retry is on its way)."""
        self.redis.set(self._key("running", run_id, round_index, device), worker, ex=self.settings.heartbeat_ttl_s)

    def _many(self, kind: str, run_id: str, round_index: int, devices: Sequence[int]) -> list[bytes | None]:
        if not devices:
            return []
        return list(self.redis.mget([self._key(kind, run_id, round_index, device) for device in devices]))

    def attempts_of(self, run_id: str, round_index: int, devices: Sequence[int]) -> dict[int, int]:
        values = self._many("attempts", run_id, round_index, devices)
        return {device: int(value or 0) for device, value in zip(devices, values)}

    def running_of(self, run_id: str, round_index: int, devices: Sequence[int]) -> dict[int, bool]:
        values = self._many("running", run_id, round_index, devices)
        return {device: value is not None for device, value in zip(devices, values)}

    def requeued_of(self, run_id: str, round_index: int, devices: Sequence[int]) -> dict[int, int | None]:
        values = self._many("requeued", run_id, round_index, devices)
        return {device: None if value is None else int(value) for device, value in zip(devices, values)}

    def mark_requeued(self, run_id: str, round_index: int, device: int, attempts: int) -> None:
        key = self._key("requeued", run_id, round_index, device)
        self.redis.set(key, attempts, ex=self.settings.blob_ttl_s)

    def broker_state_lost(self, run_id: str) -> bool:
        """True once after Redis lost its data (a restart without persistence), False otherwise.

        A marker key is written per run; finding it gone means the queue, the blobs and
        the counters of that run are gone too.
        """
        key = f"{self.settings.key_prefix}:live:{run_id}"
        created = self.redis.set(key, 1, nx=True, ex=self.settings.blob_ttl_s)
        return bool(created)

    def queue_length(self) -> int:
        """Messages waiting on the device queue (not those delivered and unacknowledged)."""
        return int(self.redis.llen(f"{self.settings.key_prefix}:{self.settings.queue_name}"))

    def stranded_long_enough(self, run_id: str, round_index: int, device: int) -> bool:
        """Note a task seen neither queued, running nor done; True once it was seen so a heartbeat ago.

        Such a message was delivered to a worker that died before starting it: it waits
        unacknowledged until the visibility timeout. Two sightings a heartbeat apart rule
        out a worker that had only just taken it.
        """
        key = self._key("stranded", run_id, round_index, device)
        now = time.time()
        if self.redis.set(key, now, nx=True, ex=self.settings.heartbeat_ttl_s * 10):
            return False
        first_seen = float(self.redis.get(key) or now)
        if now - first_seen < self.settings.heartbeat_ttl_s:
            return False
        self.redis.delete(key)
        return True

    def mark_enqueued(self, run_id: str, round_index: int) -> None:
        """Every task of the round is on the queue (written after the last one was sent)."""
        self.redis.set(f"{self.settings.key_prefix}:enqueued:{run_id}:{round_index}", 1, ex=self.settings.blob_ttl_s)

    def was_enqueued(self, run_id: str, round_index: int) -> bool:
        return bool(self.redis.exists(f"{self.settings.key_prefix}:enqueued:{run_id}:{round_index}"))

    def mark_broker_state(self, run_id: str) -> None:
        self.redis.set(f"{self.settings.key_prefix}:live:{run_id}", 1, ex=self.settings.blob_ttl_s)

    def attempts(self, run_id: str, round_index: int, device: int) -> int:
        """How many deliveries of this device task have started so far."""
        return int(self.redis.get(self._attempt_key(run_id, round_index, device)) or 0)

    def close(self) -> None:
        self.store.close()
        self.redis.close()


def open_services(settings: Settings, enqueue: Enqueue, *, migrate: bool) -> Services:
    if not settings.broker_url:
        raise ConfigError("FEDQUEUE_BROKER_URL: not set")
    client = connect_redis(settings.broker_url)
    store = open_store(settings.database_url, migrate=migrate)
    blobs: BlobStore
    if settings.blob_dir:
        blobs = DirBlobStore(settings.blob_dir)
    else:
        blobs = RedisBlobStore(client, settings.key_prefix, settings.blob_ttl_s)
    return Services(settings=settings, store=store, blobs=blobs, redis=client, enqueue=enqueue)
