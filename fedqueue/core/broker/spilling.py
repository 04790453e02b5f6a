"""Blobs in Redis while it has room, in the store when it has not: Redis never fills up with blobs.

When the broker has a `maxmemory`, a blob that would take Redis past its high-water mark (or that Redis refuses
as out of memory) is kept in the store's spilled-blob table instead, with the same expiry. Reads take Redis
first and look up what it lacks in the store; deletes and existence checks cover both. Refs and messages are
the same wherever a blob lies, and every read still checks its sha256. A spilled blob is kept under its Redis
name (key prefix included), so deployments with other prefixes may share the store.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable, Sequence

import redis

from fedqueue.core.broker.blobs import RedisBlobStore, blob_ref, checked_blob
from fedqueue.core.broker.broker_memory import BrokerMemory
from fedqueue.core.codec import BlobRef
from fedqueue.store import Store
from fedqueue.store.spilled import delete_spilled, get_spilled, purge_expired, put_spilled, spilled_exists

log = logging.getLogger(__name__)

PURGE_EVERY_S = 60.0  # expired spilled blobs are dropped at most this often by one process
SAY_EVERY_S = 60.0  # "blobs go to the store" is logged at most this often by one process


def is_out_of_memory(err: redis.RedisError) -> bool:
    """Redis refused a write because it reached maxmemory (a pipeline's error carries the command's text first)."""
    return isinstance(err, redis.exceptions.OutOfMemoryError) or "OOM command not allowed" in str(err)


class SpillingBlobStore:
    """A `BlobStore` over Redis (`RedisBlobStore`) that spills to the store when the broker is near its limit."""

    def __init__(self, redis_blobs: RedisBlobStore, memory: BrokerMemory, store: Store, ttl_s: int) -> None:
        self.redis = redis_blobs  # where blobs go while the broker has room
        self._memory = memory
        self._store = store
        self._ttl_s = ttl_s
        self._lock = threading.Lock()
        self._purged_at = time.monotonic()
        self._said_at: float | None = None

    def put(self, key: str, data: bytes) -> BlobRef:
        return self.put_many([(key, data)])[0]

    def put_many(self, items: Sequence[tuple[str, bytes]]) -> list[BlobRef]:
        fits = [(key, data) for key, data in items if self._memory.reserve(len(data))]
        kept = {key for key, _ in fits}
        spill = [(key, data) for key, data in items if key not in kept]
        if fits:
            try:
                self.redis.put_many(fits)
            except redis.ResponseError as err:
                if not is_out_of_memory(err):
                    raise
                self._memory.forget()  # something else filled Redis: read it afresh next time
                spill = list(items)
        if spill:
            self._spill(spill)
        return [blob_ref(key, data) for key, data in items]

    def _spill(self, items: Sequence[tuple[str, bytes]]) -> None:
        put_spilled(self._store, [(self.redis.name(key), data) for key, data in items], self._ttl_s)
        # An older copy in Redis under the same key would be read first: it goes (DEL is allowed at the limit).
        self.redis.delete(key for key, _ in items)
        self._say(sum(len(data) for _, data in items))
        self._maybe_purge()

    def _say(self, nbytes: int) -> None:
        now = time.monotonic()
        with self._lock:
            if self._said_at is not None and now - self._said_at < SAY_EVERY_S:
                return
            self._said_at = now
        mib = self._memory.limit() / 2**20
        log.warning(
            "broker near its memory limit (maxmemory %.0f MiB): blobs go to the store meanwhile (%d bytes now)",
            mib,
            nbytes,
        )

    def _maybe_purge(self) -> None:
        now = time.monotonic()
        with self._lock:
            if now - self._purged_at < PURGE_EVERY_S:
                return
            self._purged_at = now
        purge_expired(self._store)

    def get(self, ref: BlobRef) -> bytes:
        return self.get_many([ref])[0]

    def get_many(self, refs: Sequence[BlobRef]) -> list[bytes]:
        """Redis in round trips whose replies stay a small share of maxmemory; what it lacks, from the store."""
        found: list[bytes | None] = []
        for chunk in _chunks(refs, self._memory.read_bytes()):
            found += self.redis.get_many_raw(chunk)
        missing = [self.redis.name(ref.key) for ref, data in zip(refs, found, strict=True) if data is None]
        spilled = get_spilled(self._store, missing)
        return [
            checked_blob(ref, data if data is not None else spilled.get(self.redis.name(ref.key)))
            for ref, data in zip(refs, found, strict=True)
        ]

    def delete(self, keys: Iterable[str]) -> None:
        names = list(keys)
        self.redis.delete(names)
        if names and self._memory.limit():
            delete_spilled(self._store, [self.redis.name(key) for key in names])
            self._maybe_purge()

    def exists(self, key: str) -> bool:
        return self.redis.exists(key) or spilled_exists(self._store, self.redis.name(key))


def _chunks(refs: Sequence[BlobRef], max_bytes: int) -> list[Sequence[BlobRef]]:
    """Consecutive runs of refs of at most `max_bytes` together (one blob alone may pass it); 0: one run."""
    if not max_bytes:
        return [refs] if refs else []
    chunks: list[Sequence[BlobRef]] = []
    start, total = 0, 0
    for index, ref in enumerate(refs):
        if index > start and total + ref.nbytes > max_bytes:
            chunks.append(refs[start:index])
            start, total = index, 0
        total += ref.nbytes
    if start < len(refs):
        chunks.append(refs[start:])
    return chunks
