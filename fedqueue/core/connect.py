"""Opening a process's services: the broker's Redis, the store with every installed kind's tables, blobs, ledger.

Apart from `Services` (fedqueue.core.services) because opening the store reads the job-kind registry, and the
registry's handlers take `Services`: the type sits below both, the opener above them.
"""

from __future__ import annotations

from fedqueue.config import Settings
from fedqueue.core.broker.blobs import BlobStore, DirBlobStore, RedisBlobStore
from fedqueue.core.broker.broker_memory import BrokerMemory
from fedqueue.core.broker.ledger import RedisLedger
from fedqueue.core.broker.shm import with_shared_memory
from fedqueue.core.broker.spilling import SpillingBlobStore
from fedqueue.core.database import open_store
from fedqueue.core.runs.cancel import unless_cancelled
from fedqueue.core.services import Enqueue, Services, WorkerSlots, connect_redis, no_workers_known
from fedqueue.errors import ConfigError


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
        # Kept under the broker's maxmemory: what does not fit goes to the store.
        redis_blobs = RedisBlobStore(client, settings.key_prefix, settings.blob_ttl_s)
        blobs = SpillingBlobStore(redis_blobs, BrokerMemory(client), store, settings.blob_ttl_s)
    # Workers on this host share blobs as files in shared memory; the store above is for other hosts.
    blobs = with_shared_memory(settings, blobs, client)
    return Services(
        settings=settings,
        store=store,
        blobs=blobs,
        ledger=RedisLedger(client, settings),
        enqueue=unless_cancelled(enqueue, store),  # a cancelled run's tasks are never sent
        worker_slots=worker_slots,
    )
