"""Blob stores on real backends (the Redis service and a folder) and the safetensors encoding."""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
import redis
import torch

from fedqueue.core.broker.blobs import DirBlobStore, RedisBlobStore
from fedqueue.core.codec import BlobRef
from fedqueue.errors import BlobIntegrityError
from fedqueue.fl.ml.weights import decode_state, encode_state

TTL_S = 120


@dataclass
class Backend:
    """A blob store plus direct access to where it keeps bytes, to check and tamper behind its back."""

    name: str
    store: RedisBlobStore | DirBlobStore
    raw: Callable[[str], bytes | None]  # the stored bytes of a key, None when absent
    overwrite: Callable[[str, bytes], None]


@pytest.fixture
def redis_client(redis_url: str, key_prefix: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url)
    yield client
    keys = list(client.scan_iter(match=f"{key_prefix}-blobs:*", count=1000))
    if keys:
        client.delete(*keys)
    client.close()


@pytest.fixture(params=["redis", "dir"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    if request.param == "redis":
        client: redis.Redis = request.getfixturevalue("redis_client")
        prefix = f"{request.getfixturevalue('key_prefix')}-blobs"

        def name(key: str) -> str:
            return f"{prefix}:blob:{key}"

        def get(key: str) -> bytes | None:
            value = client.get(name(key))
            assert value is None or isinstance(value, bytes)  # the client does not decode replies
            return value

        def put(key: str, data: bytes) -> None:
            client.set(name(key), data, keepttl=True)

        return Backend("redis", RedisBlobStore(client, prefix, ttl_s=TTL_S), raw=get, overwrite=put)
    root = tmp_path / "blobs"

    def read(key: str) -> bytes | None:
        path = root / key
        return path.read_bytes() if path.exists() else None

    def write(key: str, data: bytes) -> None:
        (root / key).write_bytes(data)

    return Backend("dir", DirBlobStore(root), raw=read, overwrite=write)


def unique_key(suffix: str = "blob") -> str:
    return f"run-{uuid.uuid4().hex[:12]}/{suffix}"


def test_put_get_round_trip_with_sha256(backend: Backend) -> None:
    """Bytes come back identical; the ref carries the key, the true sha256 and the size."""
    key = unique_key("global/1")
    data = bytes(range(256)) * 33 + b"tail"
    ref = backend.store.put(key, data)
    assert ref.key == key
    assert ref.sha256 == hashlib.sha256(data).hexdigest()
    assert ref.nbytes == len(data)
    assert backend.raw(key) == data
    assert backend.store.get(ref) == data


def test_put_replaces_previous_bytes(backend: Backend) -> None:
    """A second put under the same key stores the new bytes; the old ref no longer verifies."""
    key = unique_key()
    old = backend.store.put(key, b"old bytes")
    new = backend.store.put(key, b"new bytes")
    assert backend.store.get(new) == b"new bytes"
    with pytest.raises(BlobIntegrityError, match="sha256"):
        backend.store.get(old)


def test_tampered_blob_is_refused(backend: Backend) -> None:
    """Bytes changed in storage behind the store's back fail the sha256 check."""
    key = unique_key()
    ref = backend.store.put(key, b"the real weights")
    backend.overwrite(key, b"the fake weights")
    assert backend.raw(key) == b"the fake weights"
    with pytest.raises(BlobIntegrityError, match="does not match its sha256"):
        backend.store.get(ref)


def test_many_blobs_in_one_call_are_checked_each(backend: Backend) -> None:
    """put_many and get_many (one Redis round trip) keep every blob's key, bytes and sha256 check."""
    items = [(unique_key(), f"update {index}".encode()) for index in range(5)]
    refs = backend.store.put_many(items)
    assert [ref.key for ref in refs] == [key for key, _ in items]
    assert backend.store.get_many(list(reversed(refs))) == [data for _, data in reversed(items)]
    assert backend.store.get_many([]) == []
    backend.overwrite(items[3][0], b"tampered")
    with pytest.raises(BlobIntegrityError, match="does not match its sha256"):
        backend.store.get_many(refs)


def test_missing_blob_is_refused(backend: Backend) -> None:
    """A key never stored is reported missing."""
    key = unique_key()
    ref = BlobRef(key=key, sha256=hashlib.sha256(b"x").hexdigest(), nbytes=1)
    with pytest.raises(BlobIntegrityError, match="missing") as caught:
        backend.store.get(ref)
    assert key in str(caught.value)


def test_delete_removes(backend: Backend) -> None:
    """Deleted keys are gone from storage and reported missing; other keys stay; deleting again is fine."""
    gone, kept = unique_key("a"), unique_key("b")
    ref = backend.store.put(gone, b"aaa")
    kept_ref = backend.store.put(kept, b"bbb")
    backend.store.delete([gone])
    assert backend.raw(gone) is None
    with pytest.raises(BlobIntegrityError, match="missing"):
        backend.store.get(ref)
    assert backend.store.get(kept_ref) == b"bbb"
    backend.store.delete([gone])  # already absent: no error
    backend.store.delete([])


def test_ref_with_wrong_sha_is_refused(backend: Backend) -> None:
    """A ref whose sha256 is not the stored bytes' hash is refused."""
    ref = backend.store.put(unique_key(), b"payload")
    wrong = replace(ref, sha256=hashlib.sha256(b"other payload").hexdigest())
    with pytest.raises(BlobIntegrityError, match="sha256"):
        backend.store.get(wrong)


def test_redis_blobs_get_a_ttl(redis_client: redis.Redis, key_prefix: str) -> None:
    """Every Redis blob expires: its TTL is positive and at most the configured one."""
    prefix = f"{key_prefix}-blobs"
    store = RedisBlobStore(redis_client, prefix, ttl_s=TTL_S)
    key = unique_key()
    store.put(key, b"expiring")
    ttl = redis_client.ttl(f"{prefix}:blob:{key}")
    assert 0 < ttl <= TTL_S


@pytest.mark.parametrize("key", ["../x", "a/../../x", "/tmp/fedqueue-escape-test-x"])
def test_dir_store_refuses_escaping_keys(tmp_path: Path, key: str) -> None:
    """A key that leads outside the blob folder is refused on put, get and delete, and writes nothing."""
    root = tmp_path / "blobs"
    store = DirBlobStore(root)
    with pytest.raises(BlobIntegrityError, match="escapes"):
        store.put(key, b"x")
    with pytest.raises(BlobIntegrityError, match="escapes"):
        store.get(BlobRef(key=key, sha256=hashlib.sha256(b"x").hexdigest(), nbytes=1))
    with pytest.raises(BlobIntegrityError, match="escapes"):
        store.delete([key])
    assert not (tmp_path / "x").exists()
    assert not Path("/tmp/fedqueue-escape-test-x").exists()


def sample_state() -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(3)
    return {
        "layer.weight": torch.randn(5, 7, generator=generator),
        "layer.weight_t": torch.randn(7, 5, generator=generator).t(),  # not contiguous
        "layer.bias": torch.randn(5, generator=generator, dtype=torch.float64),
        "bn.num_batches_tracked": torch.tensor(2**40 + 3, dtype=torch.int64),
        "counts": torch.tensor([-(2**62), 0, 2**62 + 1], dtype=torch.int64),
        "half": torch.randn(4, generator=generator).to(torch.bfloat16),
        "empty": torch.empty(0, 3),
        "flags": torch.tensor([True, False, True]),
    }


def assert_same_state(left: dict[str, torch.Tensor], right: dict[str, torch.Tensor]) -> None:
    assert left.keys() == right.keys()
    for name in left:
        assert left[name].dtype == right[name].dtype, name
        assert left[name].shape == right[name].shape, name
        assert torch.equal(left[name], right[name]), name


def test_encode_decode_state_is_exact() -> None:
    """A state dict survives encode/decode bit for bit (decoded by the safetensors library), int64 buffers,
    non-contiguous, empty and boolean tensors included."""
    state = sample_state()
    decoded = decode_state(encode_state(state))
    assert_same_state(state, decoded)
    assert decoded["bn.num_batches_tracked"].item() == 2**40 + 3


def test_state_through_a_blob_store(backend: Backend) -> None:
    """Encoded weights stored and read back through a blob store decode to the same tensors."""
    state = sample_state()
    ref = backend.store.put(unique_key("global/0"), encode_state(state))
    assert_same_state(state, decode_state(backend.store.get(ref)))
