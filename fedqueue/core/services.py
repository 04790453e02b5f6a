"""The connections one process holds: store, blob store, task ledger. Opened once, shared by threads.

Opened by `fedqueue.core.connect.open_services`: this module stays below the job-kind registry, which names
`Services` in its handlers' signatures.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import redis

from fedqueue.config import Settings, mask_url
from fedqueue.core.broker.blobs import BlobStore
from fedqueue.core.broker.ledger import TaskLedger
from fedqueue.errors import ConfigError, ServiceUnavailable
from fedqueue.store import Store

# Sends task messages (any kind's) to their queues; see `fedqueue.queue.publish`.
Enqueue = Callable[[Sequence[Any]], None]
# The workers answering now, by hostname, with their concurrent task slots (the queue asks Celery).
WorkerSlots = Callable[[], dict[str, int]]


# A question to any worker (its task name, its JSON): the answer's JSON and bytes, or None where no worker took it
# in time or it failed there (the caller then does the work itself); see `fedqueue.queue.ask`.
AskWorkers = Callable[[str, dict[str, Any]], tuple[dict[str, Any], bytes] | None]


def no_workers_known() -> dict[str, int]:
    return {}


def no_worker_asked(_name: str, _question: dict[str, Any]) -> None:
    return None


def check_broker_url(url: str) -> None:
    if not url.startswith(("redis://", "rediss://", "unix://")):
        raise ConfigError(f"FEDQUEUE_BROKER_URL: expected a redis:// URL, got {mask_url(url)}")


def connect_redis(url: str) -> redis.Redis:
    """A client for the broker's Redis, checked with a ping that fails within seconds."""
    check_broker_url(url)
    client = redis.Redis.from_url(url, socket_connect_timeout=3, socket_timeout=30, health_check_interval=30)
    try:
        client.ping()
    except redis.RedisError as err:
        raise ServiceUnavailable(f"broker {mask_url(url)} is unreachable: {err}") from None
    return client


@dataclass
class Services:
    """What one process works with: settings, store, blobs, task ledger and publisher.

    The blob store, the ledger and the publisher are small protocols (`BlobStore`, `TaskLedger`,
    `Enqueue`): Redis or a folder and Celery here, in-memory twins in `fedqueue.core.broker.memory`, so
    scheduling and repair run in tests without a broker (the store is SQL: SQLite in a file there).
    """

    settings: Settings
    store: Store
    blobs: BlobStore
    ledger: TaskLedger
    enqueue: Enqueue
    worker_slots: WorkerSlots = no_workers_known
    ask_workers: AskWorkers = no_worker_asked

    def close(self) -> None:
        self.store.close()
        self.ledger.close()
