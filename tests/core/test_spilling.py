"""Blobs under a broker's maxmemory: a real Redis of the test's own with a small `maxmemory` and `noeviction`,
and the store on SQLite and on Postgres. Blobs past the high-water mark (or refused as out of memory) go to the
store and read back whole; Redis keeps room for everyone else's small writes."""

from __future__ import annotations

import hashlib
import time
import uuid
from collections.abc import Iterator

import pytest
import redis
from sqlalchemy import select, update

from fedqueue.core.broker.blobs import RedisBlobStore
from fedqueue.core.broker.broker_memory import HIGH_WATER, BrokerMemory
from fedqueue.core.broker.spilling import SpillingBlobStore
from fedqueue.core.codec import BlobRef
from fedqueue.errors import BlobIntegrityError
from fedqueue.queue.embedded import EmbeddedRedis
from fedqueue.store import Store
from fedqueue.store.schema import SpilledBlobRow
from fedqueue.store.spilled import purge_expired

LIMIT = 8 * 2**20
BLOB = 256 * 2**10
TTL_S = 120


@pytest.fixture(scope="module")
def small_redis() -> Iterator[EmbeddedRedis]:
    with EmbeddedRedis(extra_args=["--maxmemory", str(LIMIT), "--maxmemory-policy", "noeviction"]) as server:
        yield server


@pytest.fixture
def client(small_redis: EmbeddedRedis) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(small_redis.url)
    client.flushall()
    yield client
    client.flushall()
    client.close()


def spilling(
    client: redis.Redis, store: Store, high_water: float = HIGH_WATER, ttl_s: int = TTL_S
) -> SpillingBlobStore:
    prefix = f"spill-{uuid.uuid4().hex[:6]}"
    return SpillingBlobStore(RedisBlobStore(client, prefix, ttl_s), BrokerMemory(client, high_water), store, ttl_s)


def blob(index: int, size: int = BLOB) -> bytes:
    return hashlib.sha256(str(index).encode()).digest() * (size // 32)


def spilled_keys(store: Store, blobs: SpillingBlobStore) -> set[str]:
    """The blobs of `blobs` kept in the store, by key (the store keeps them under their Redis names)."""
    prefix = blobs.redis.name("")
    with store.session() as session:
        names = session.scalars(select(SpilledBlobRow.key).where(SpilledBlobRow.key.startswith(prefix)))
        return {name.removeprefix(prefix) for name in names}


def used(client: redis.Redis) -> int:
    return int(client.info("memory")["used_memory"])


def test_blobs_past_the_high_water_mark_go_to_the_store_and_read_back_whole(client: redis.Redis, store: Store) -> None:
    """Three times maxmemory of blobs, one by one and in batches: Redis stays under its high-water mark, the rest
    is in the store, every blob reads back (alone and many at once), and Redis still takes a small write."""
    blobs = spilling(client, store)
    items = [(f"run/update/1/{index}/x", blob(index)) for index in range(3 * LIMIT // BLOB)]
    refs = [blobs.put(key, data) for key, data in items[:40]] + blobs.put_many(items[40:])
    assert used(client) < LIMIT * HIGH_WATER + BLOB
    spilled = spilled_keys(store, blobs)
    assert 0 < len(spilled) < len(items)
    assert blobs.get_many(refs) == [data for _, data in items]
    assert all(blobs.get(ref) == data for ref, (_, data) in zip(refs, items, strict=True))
    assert all(blobs.exists(key) for key, _ in items)
    client.set("celery-bookkeeping", b"x" * 1000)  # never refused as out of memory


def test_a_write_refused_as_out_of_memory_goes_to_the_store(client: redis.Redis, store: Store) -> None:
    """Redis filled behind the store's back (its reading is stale or another client wrote): the refused blobs,
    alone or in a pipeline, are kept in the store and nothing is lost."""
    blobs = spilling(client, store, high_water=100.0)  # believes everything fits: only Redis's refusal stops it
    with pytest.raises(redis.exceptions.OutOfMemoryError):
        for index in range(LIMIT // BLOB + 10):
            client.set(f"filler-{index}", blob(index))
    one = blobs.put("run/global/1", blob(1000))
    many = blobs.put_many([(f"run/update/1/{index}/x", blob(2000 + index)) for index in range(4)])
    assert {"run/global/1", *(ref.key for ref in many)} <= spilled_keys(store, blobs)
    assert blobs.get(one) == blob(1000)
    assert blobs.get_many(many) == [blob(2000 + index) for index in range(4)]


def test_delete_and_exists_cover_redis_and_the_store(client: redis.Redis, store: Store) -> None:
    blobs = spilling(client, store)
    refs = blobs.put_many([(f"run/update/2/{index}/x", blob(index)) for index in range(3 * LIMIT // BLOB)])
    in_store = spilled_keys(store, blobs)
    in_redis = [ref.key for ref in refs if ref.key not in in_store]
    assert in_store and in_redis
    blobs.delete([next(iter(in_store)), in_redis[0]])
    for key in (next(iter(in_store)), in_redis[0]):
        assert not blobs.exists(key)
        with pytest.raises(BlobIntegrityError, match="missing"):
            blobs.get(next(ref for ref in refs if ref.key == key))
    blobs.delete(ref.key for ref in refs)
    assert not spilled_keys(store, blobs) and not any(blobs.exists(ref.key) for ref in refs)


def test_a_spilled_blob_replaces_an_older_copy_in_redis(client: redis.Redis, store: Store) -> None:
    """The same key put again while Redis is full: the new bytes are read, not the old copy Redis still had."""
    blobs = spilling(client, store)
    old = blobs.put("run/global/3", b"old bytes")
    assert not spilled_keys(store, blobs)
    blobs.put_many([(f"run/update/3/{index}/x", blob(index)) for index in range(LIMIT // BLOB)])  # past the mark
    new = blobs.put("run/global/3", blob(99))
    assert "run/global/3" in spilled_keys(store, blobs)
    assert blobs.get(new) == blob(99)
    with pytest.raises(BlobIntegrityError, match="sha256"):
        blobs.get(old)


def test_a_tampered_spilled_blob_is_refused(client: redis.Redis, store: Store) -> None:
    blobs = spilling(client, store, high_water=0.0)  # every blob spills
    ref = blobs.put("run/update/4/0/x", b"the real weights")
    with store.session() as session, session.begin():
        session.execute(
            update(SpilledBlobRow).where(SpilledBlobRow.key == blobs.redis.name(ref.key)).values(data=b"fake weights")
        )
    with pytest.raises(BlobIntegrityError, match="does not match its sha256"):
        blobs.get(ref)


def test_spilled_blobs_expire_like_redis_ones_and_are_purged(client: redis.Redis, store: Store) -> None:
    blobs = spilling(client, store, high_water=0.0, ttl_s=1)
    ref = blobs.put("run/update/5/0/x", b"short-lived")
    assert blobs.get(ref) == b"short-lived"
    time.sleep(1.2)
    assert not blobs.exists(ref.key)
    with pytest.raises(BlobIntegrityError, match="missing"):
        blobs.get(ref)
    assert purge_expired(store) >= 1 and not spilled_keys(store, blobs)


def test_an_unlimited_redis_keeps_every_blob(redis_url: str, store: Store) -> None:
    """No maxmemory: nothing spills, whatever the size."""
    client = redis.Redis.from_url(redis_url)
    if int(client.info("memory")["maxmemory"]):
        pytest.skip("the Redis service has a maxmemory")
    blobs = spilling(client, store)
    refs = blobs.put_many([(f"run/update/6/{index}/x", blob(index)) for index in range(8)])
    try:
        assert not spilled_keys(store, blobs)
        assert blobs.get_many(refs) == [blob(index) for index in range(8)]
    finally:
        blobs.delete(ref.key for ref in refs)
        client.close()


def test_a_ref_to_a_blob_never_stored_is_missing(client: redis.Redis, store: Store) -> None:
    blobs = spilling(client, store)
    ref = BlobRef(key="run/update/7/0/x", sha256=hashlib.sha256(b"x").hexdigest(), nbytes=1)
    with pytest.raises(BlobIntegrityError, match="missing"):
        blobs.get_many([ref])
