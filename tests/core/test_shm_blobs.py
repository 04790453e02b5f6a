"""Blobs through shared memory: files on this host, Redis for other hosts, swept when old or when the cluster
stops, Redis where the folder is full; and a run of real workers that moves no update through Redis."""

from __future__ import annotations

import hashlib
import os
import resource
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import BinaryIO

import pytest
import redis
import torch

from fedqueue.config import Settings
from fedqueue.core.broker import keys, shm
from fedqueue.core.broker.blobs import RedisBlobStore
from fedqueue.core.broker.shm import (
    PARTIAL,
    SPARE,
    SharedMemoryBlobStore,
    listens_on_loopback_only,
    remove_cluster_files,
    shm_root,
)
from fedqueue.core.connect import open_services
from fedqueue.errors import BlobIntegrityError
from fedqueue.fl import api
from fedqueue.fl.ml.weights import decode_state, encode_state, write_state
from fedqueue.fl.worker.state_blobs import get_state, publish_state, put_state, recycle_states
from fedqueue.queue.embedded import EmbeddedRedis
from tests.conftest import running_workers
from tests.support.helpers import assert_same_weights, reference_final_state, small_config

TTL_S = 120


def _state() -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(3)
    return {
        "w": torch.randn(300, 40, generator=generator),
        "b": torch.randn(40, generator=generator).to(torch.bfloat16),
        "steps": torch.tensor(7, dtype=torch.int64),
    }


def _same(left: dict[str, torch.Tensor], right: dict[str, torch.Tensor]) -> None:
    assert sorted(left) == sorted(right)
    for name in left:
        assert left[name].dtype == right[name].dtype and torch.equal(left[name], right[name]), name


@pytest.fixture
def redis_blobs(redis_url: str, key_prefix: str) -> Iterator[RedisBlobStore]:
    client = redis.Redis.from_url(redis_url)
    prefix = f"{key_prefix}-shm"
    yield RedisBlobStore(client, prefix, ttl_s=TTL_S)
    found = list(client.scan_iter(match=f"{keys.blob_prefix(prefix)}*", count=1000))
    if found:
        client.delete(*found)
    client.close()


def _redis_keys(blobs: RedisBlobStore) -> list[bytes]:
    return list(blobs._client.scan_iter(match=blobs.name("*"), count=1000))


def test_one_host_blobs_stay_in_shared_memory_and_map_back(tmp_path: Path, redis_blobs: RedisBlobStore) -> None:
    blobs = SharedMemoryBlobStore(tmp_path, redis_blobs, one_host=True, ttl_s=TTL_S)
    state = _state()
    ref = put_state(blobs, "run/update/1/0/ab", state)
    # Named by a fresh tag, not by a hash of 45 MB; the file is standard safetensors.
    path = blobs.local_path(ref)
    assert path is not None and path.stat().st_size == ref.nbytes
    assert ref.sha256 != hashlib.sha256(path.read_bytes()).hexdigest()
    _same(decode_state(path.read_bytes()), state)
    _same(get_state(blobs, ref), state)
    _same(decode_state(blobs.get(ref)), state)
    assert _redis_keys(redis_blobs) == []
    # A model from bytes is named by its sha256, which a checkpoint of it can be checked against.
    model = blobs.put("run/global/0", b"model bytes")
    assert model.sha256 == hashlib.sha256(b"model bytes").hexdigest() and blobs.get(model) == b"model bytes"
    assert blobs.exists("run/update/1/0/ab") and not blobs.exists("run/update/1/0/other")


@pytest.mark.parametrize("one_host", [True, False])
def test_a_published_state_is_named_by_its_sha256_taken_as_it_is_written(
    tmp_path: Path, redis_blobs: RedisBlobStore, one_host: bool
) -> None:
    """A version a checkpoint keeps: its digest says its content (no encoding in between on one host), and its
    bytes come back as they are stored, from its file."""
    blobs = SharedMemoryBlobStore(tmp_path, redis_blobs, one_host=one_host, ttl_s=TTL_S)
    state = _state()
    ref, stored = publish_state(blobs, "run/global/2", state)
    path = blobs.local_path(ref)
    assert path is not None
    assert ref.sha256 == hashlib.sha256(path.read_bytes()).hexdigest() == hashlib.sha256(stored).hexdigest()
    assert bytes(stored) == encode_state(state) and ref.nbytes == len(stored)
    assert not isinstance(stored, memoryview) or stored.readonly  # a map of the file, never written through
    _same(get_state(blobs, ref), state)
    # On one host nothing went to Redis; for other hosts the bytes are there under the same digest.
    assert (_redis_keys(redis_blobs) == []) == one_host
    if not one_host:
        assert redis_blobs.get(ref) == bytes(stored)
    # Where the folder is full the bytes are the encoding, and the ref the broker's.
    limit = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (1024, limit[1]))
    try:
        full, encoded = publish_state(blobs, "run/global/3", state)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, limit)
    assert blobs.local_path(full) is None and full.sha256 == hashlib.sha256(encoded).hexdigest()
    assert list((tmp_path / PARTIAL).iterdir()) == []


def test_a_mapped_state_is_private_to_its_reader(tmp_path: Path, redis_blobs: RedisBlobStore) -> None:
    blobs = SharedMemoryBlobStore(tmp_path, redis_blobs, one_host=True, ttl_s=TTL_S)
    ref = put_state(blobs, "run/global/1", _state())
    get_state(blobs, ref)["w"].add_(1.0)  # a reader's change stays its own
    _same(get_state(blobs, ref), _state())


def test_a_reader_on_another_host_gets_the_bytes_through_redis(tmp_path: Path, redis_blobs: RedisBlobStore) -> None:
    here = SharedMemoryBlobStore(tmp_path / "here", redis_blobs, one_host=False, ttl_s=TTL_S)
    elsewhere = SharedMemoryBlobStore(tmp_path / "elsewhere", redis_blobs, one_host=False, ttl_s=TTL_S)
    state = _state()
    ref = put_state(here, "run/update/1/3/cd", state)
    assert elsewhere.local_path(ref) is None
    _same(get_state(elsewhere, ref), state)  # from Redis, its sha256 checked
    redis_blobs._client.set(redis_blobs.name(ref.key), b"tampered")
    with pytest.raises(BlobIntegrityError, match="sha256"):
        elsewhere.get(ref)
    # This host's readers take the file, whatever Redis holds.
    _same(get_state(here, ref), state)
    here.delete([ref.key])
    assert not here.exists(ref.key) and _redis_keys(redis_blobs) == []


def test_deletes_sweeps_and_a_stopped_cluster_leave_no_files(tmp_path: Path, redis_blobs: RedisBlobStore) -> None:
    root = tmp_path / "cluster"
    blobs = SharedMemoryBlobStore(root, redis_blobs, one_host=True, ttl_s=TTL_S)
    kept = put_state(blobs, "run/update/1/0/aa", _state())
    old = put_state(blobs, "run/update/1/1/bb", _state())
    gone = put_state(blobs, "run/update/2/0/cc", _state())
    blobs.delete([gone.key])
    assert not (root / "run" / "update" / "2").exists()  # its emptied folders too
    # A writer killed mid-write leaves a partial file no reader names; it goes once old, as do expired blobs.
    (root / PARTIAL).mkdir(exist_ok=True)
    partial = root / PARTIAL / "tmpkilled"
    partial.write_bytes(b"half a state")
    long_ago = time.time() - 2 * 3600
    old_path = blobs.local_path(old)
    assert old_path is not None
    os.utime(partial, (long_ago, long_ago))
    os.utime(old_path, (long_ago, long_ago))
    assert blobs.sweep() == 2
    assert blobs.local_path(kept) is not None and blobs.local_path(old) is None and not partial.exists()
    with pytest.raises(BlobIntegrityError, match="missing"):
        blobs.get(old)
    settings = Settings(broker_url="redis://127.0.0.1:1/0", key_prefix="swept", blob_shm_dir=str(tmp_path))
    cluster = shm_root(settings)
    assert cluster is not None
    cluster.mkdir(parents=True)
    (cluster / "left").write_bytes(b"x")
    remove_cluster_files(settings)
    assert not cluster.exists()


def test_a_recycled_blobs_file_is_written_over_by_the_next_blob(
    tmp_path: Path, redis_blobs: RedisBlobStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    blobs = SharedMemoryBlobStore(tmp_path, redis_blobs, one_host=True, ttl_s=TTL_S)
    freed = put_state(blobs, "run/update/1/0/aa", _state())
    path = blobs.local_path(freed)
    assert path is not None
    inode = path.stat().st_ino
    long_ago = time.time() - 2 * 3600  # a blob kept long (a teacher kept for many versions)
    os.utime(path, (long_ago, long_ago))
    recycle_states(blobs, [freed.key])
    assert blobs.local_path(freed) is None and not blobs.exists(freed.key)
    assert not (tmp_path / "run" / "update" / "1").exists()
    # The next blob takes the freed file (its pages already in place), cut to its own size; while it writes, the
    # file is a partial of its age (a sweep beside it does not take it for one a killed writer left).
    smaller = {"w": torch.arange(12, dtype=torch.float32)}

    def write_while_swept(out: BinaryIO) -> None:
        assert blobs.sweep() == 0
        write_state(smaller, out)

    ref = blobs.write("run/update/2/0/bb", write_while_swept)
    path = blobs.local_path(ref)
    assert path is not None and path.stat().st_ino == inode and path.stat().st_size == ref.nbytes
    _same(get_state(blobs, ref), smaller)
    assert list((tmp_path / SPARE).iterdir()) == []
    # Spares are bounded: past the bound a recycled blob's file goes as a deleted one does.
    monkeypatch.setattr(shm, "SPARE_MAX_BYTES", ref.nbytes - 1)
    blobs.recycle([ref.key])
    assert list((tmp_path / SPARE).iterdir()) == [] and blobs.local_path(ref) is None
    # A spare no writer takes goes once old.
    monkeypatch.setattr(shm, "SPARE_MAX_BYTES", 1 << 20)
    blobs.recycle([put_state(blobs, "run/update/3/0/cc", smaller).key])
    assert len(list((tmp_path / SPARE).iterdir())) == 1
    assert blobs.sweep(now=time.time() + 1) == 0
    assert blobs.sweep(now=time.time() + shm.SPARE_MAX_AGE_S + 1) == 1
    assert list((tmp_path / SPARE).iterdir()) == []


def test_a_full_folder_sends_blobs_to_redis(tmp_path: Path, redis_blobs: RedisBlobStore) -> None:
    blobs = SharedMemoryBlobStore(tmp_path, redis_blobs, one_host=True, ttl_s=TTL_S)
    state = _state()
    limit = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (1024, limit[1]))  # the kernel refuses files past 1 KiB
    try:
        ref = put_state(blobs, "run/update/1/0/full", state)
        model = blobs.put("run/global/0", bytes(4096))
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, limit)
    assert blobs.local_path(ref) is None and blobs.local_path(model) is None
    assert list((tmp_path / PARTIAL).iterdir()) == []  # no half file left behind
    assert ref.sha256 == hashlib.sha256(redis_blobs._client.get(redis_blobs.name(ref.key))).hexdigest()  # type: ignore[arg-type]
    _same(get_state(blobs, ref), state)
    assert blobs.get(model) == bytes(4096)


def test_a_run_on_one_host_moves_no_update_through_redis(settings: Settings, tmp_path: Path) -> None:
    """Real workers on a broker of the test's own: the bytes Redis receives during the run stay below what
    the updates alone weigh, no blob is left in it, and the run ends on the reference weights."""
    config = small_config(devices_per_round=6, rounds=2)
    with EmbeddedRedis() as embedded:
        settings = replace(settings, broker_url=embedded.url, blob_shm_dir=str(tmp_path))
        client = redis.Redis.from_url(embedded.url)
        with running_workers(settings, procs=2, log_dir=tmp_path / "logs"):
            before = int(client.info("stats")["total_net_input_bytes"])
            handle = api.submit(config, settings=settings)
            status = handle.wait(timeout_s=180)
            received = int(client.info("stats")["total_net_input_bytes"]) - before
        assert status["state"] == "finished", status
        assert_same_weights(handle.final_weights(), reference_final_state(config))
        updates = handle.store.task_timings(handle.id)
        services = open_services(settings, lambda _: None, migrate=False)
        try:
            assert isinstance(services.blobs, SharedMemoryBlobStore) and services.blobs.one_host
        finally:
            services.close()
        update_bytes = sum(_state_bytes(handle.final_weights()) for row in updates if row.task_type == "train")
        assert received < update_bytes, (received, update_bytes)
        assert list(client.scan_iter(match=f"{keys.blob_prefix(settings.key_prefix)}*")) == []


def _state_bytes(state: dict[str, torch.Tensor]) -> int:
    return sum(tensor.numel() * tensor.element_size() for tensor in state.values())


class _Answers:
    """A broker's answers to CONFIG GET, for the rule that reads them (the real broker's are tested below)."""

    def __init__(self, port: str, bind: str) -> None:
        self.config = {"port": port, "bind": bind}

    def config_get(self, name: str) -> dict[str, str]:
        return {name: self.config[name]}


@pytest.mark.parametrize(
    ("port", "bind", "alone"),
    [
        ("6379", "127.0.0.1 -::1", True),
        ("0", "", True),  # a unix socket only
        ("6379", "", False),  # every interface
        ("6379", "* -::*", False),
        ("6379", "127.0.0.1 10.200.1.1", False),  # loopback and an address other hosts reach
    ],
)
def test_blobs_stay_on_one_host_only_where_the_broker_listens_on_loopback_alone(
    port: str, bind: str, alone: bool
) -> None:
    assert listens_on_loopback_only(_Answers(port, bind)) is alone  # type: ignore[arg-type]


def test_the_brokers_here_listen_on_loopback_and_one_folder_serves_every_spelling_of_their_url(
    settings: Settings,
) -> None:
    with EmbeddedRedis() as embedded:
        assert listens_on_loopback_only(redis.Redis.from_url(embedded.url))
    assert listens_on_loopback_only(redis.Redis.from_url(settings.broker_url or ""))
    spellings = ["redis://127.0.0.1:6379/0", "redis://:secret@localhost:6379/0", "redis://127.0.0.1:6379"]
    assert len({shm_root(replace(settings, broker_url=url)) for url in spellings}) == 1
    assert shm_root(replace(settings, broker_url="redis://127.0.0.1:6379/1")) != shm_root(settings)
