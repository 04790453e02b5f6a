"""Weights and updates by reference: safetensors bytes in Redis (with a TTL) or a shared folder.

Messages carry only a `BlobRef` (key + sha256); every read checks the hash.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from fedqueue.core.broker import keys
from fedqueue.core.codec import BlobRef
from fedqueue.errors import BlobIntegrityError

if TYPE_CHECKING:
    import redis


class BlobStore(Protocol):
    def put(self, key: str, data: bytes) -> BlobRef: ...
    def put_many(self, items: Sequence[tuple[str, bytes]]) -> list[BlobRef]: ...
    def get(self, ref: BlobRef) -> bytes: ...
    def get_many(self, refs: Sequence[BlobRef]) -> list[bytes]: ...
    def delete(self, keys: Iterable[str]) -> None: ...
    def exists(self, key: str) -> bool: ...


READ_CHUNK_BYTES = 16 * 2**20  # blobs read in one round trip: at most this many bytes ...
READ_CHUNK_MAX = 64  # ... and this many blobs


def blobs_per_read(refs: Sequence[BlobRef]) -> int:
    """How many of these blobs one `get_many` should ask for: many small ones per round trip, big ones few."""
    largest = max((ref.nbytes for ref in refs), default=1)
    return max(1, min(READ_CHUNK_MAX, READ_CHUNK_BYTES // max(largest, 1)))


def checked_blob(ref: BlobRef, data: bytes | None) -> bytes:
    if data is None:
        raise BlobIntegrityError(f"blob {ref.key!r} is missing (expired or deleted)")
    if hashlib.sha256(data).hexdigest() != ref.sha256:
        raise BlobIntegrityError(f"blob {ref.key!r} does not match its sha256")
    return data


def blob_ref(key: str, data: bytes) -> BlobRef:
    return BlobRef(key=key, sha256=hashlib.sha256(data).hexdigest(), nbytes=len(data))


class RedisBlobStore:
    """Blobs as Redis strings under `keys.blob_prefix`, expiring after `ttl_s`."""

    def __init__(self, client: redis.Redis, prefix: str, ttl_s: int) -> None:
        self._client = client
        self._prefix = keys.blob_prefix(prefix)
        self._ttl_s = ttl_s

    def name(self, key: str) -> str:
        """The Redis key a blob lives under."""
        return self._prefix + key

    def put(self, key: str, data: bytes) -> BlobRef:
        self._client.set(self._prefix + key, data, ex=self._ttl_s)
        return blob_ref(key, data)

    def put_many(self, items: Sequence[tuple[str, bytes]]) -> list[BlobRef]:
        """Several blobs in one round trip (a pack's updates)."""
        with self._client.pipeline(transaction=False) as pipe:
            for key, data in items:
                pipe.set(self._prefix + key, data, ex=self._ttl_s)
            pipe.execute()
        return [blob_ref(key, data) for key, data in items]

    def get(self, ref: BlobRef) -> bytes:
        data: bytes | None = self._client.get(self._prefix + ref.key)  # type: ignore[assignment]
        return checked_blob(ref, data)

    def get_many(self, refs: Sequence[BlobRef]) -> list[bytes]:
        """Several blobs in one round trip (small updates, read for an aggregation)."""
        return [checked_blob(ref, data) for ref, data in zip(refs, self.get_many_raw(refs), strict=True)]

    def get_many_raw(self, refs: Sequence[BlobRef]) -> list[bytes | None]:
        """The stored bytes of each ref, unchecked, None where Redis has none (for a store that looks elsewhere)."""
        if not refs:
            return []
        found: list[bytes | None] = self._client.mget([self._prefix + ref.key for ref in refs])  # type: ignore[assignment]
        return found

    def delete(self, keys: Iterable[str]) -> None:
        names = [self._prefix + key for key in keys]
        if names:
            self._client.delete(*names)

    def exists(self, key: str) -> bool:
        return bool(self._client.exists(self._prefix + key))


class DirBlobStore:
    """Blobs as files under a folder every worker sees (shared storage across nodes)."""

    def __init__(self, root: str | Path) -> None:
        self._root = Path(root)

    def _path(self, key: str) -> Path:
        path = (self._root / key).resolve()
        if self._root.resolve() not in path.parents:
            raise BlobIntegrityError(f"blob key {key!r} escapes the blob folder")
        return path

    def put(self, key: str, data: bytes) -> BlobRef:
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        # Write then rename, so a reader never sees half a file.
        with tempfile.NamedTemporaryFile(dir=path.parent, delete=False) as tmp:
            tmp.write(data)
        os.replace(tmp.name, path)
        return blob_ref(key, data)

    def put_many(self, items: Sequence[tuple[str, bytes]]) -> list[BlobRef]:
        return [self.put(key, data) for key, data in items]

    def get(self, ref: BlobRef) -> bytes:
        try:
            data = self._path(ref.key).read_bytes()
        except FileNotFoundError:
            data = None
        return checked_blob(ref, data)

    def get_many(self, refs: Sequence[BlobRef]) -> list[bytes]:
        return [self.get(ref) for ref in refs]

    def delete(self, keys: Iterable[str]) -> None:
        for key in keys:
            self._path(key).unlink(missing_ok=True)

    def exists(self, key: str) -> bool:
        return self._path(key).is_file()
