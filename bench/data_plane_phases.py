"""What one update's trip costs, phase by phase, timed on the library calls fedqueue makes for it.

A worker encodes its trained state (safetensors), hashes it (sha256) and SETs it into Redis; the
aggregator GETs it, hashes it again, decodes it and folds it into the round's sum. The store's
timing rows give load, compute and upload per task and the aggregation per round, not these
phases apart: here each is timed alone, in this process, on a state of the size at hand.

Workers on one host share blobs through shared memory instead (the default there): the worker writes
its state straight into a file, the aggregator maps it and reads its pages, then folds it. Those phases
are timed too, with the blob store fedqueue opens, and the CPU time of the write and the map apart from
the wall time (a busy machine's wall time is mostly waiting for a core).
"""

from __future__ import annotations

import hashlib
import shutil
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import redis
    import torch

# The phases an update crosses between the end of its training and its fold, in order.
PHASES = ("encode", "hash", "put", "get", "hash again", "decode", "fold")
# The same trip through shared memory: write the file, map it and read its pages, fold.
SHM_PHASES = ("write", "map", "fold")
SHM_DIR = "/dev/shm"


@dataclass(frozen=True)
class PhaseCosts:
    """Median milliseconds of each phase for one update of `nbytes` encoded bytes."""

    nbytes: int
    ms: dict[str, float]
    shm_ms: dict[str, float] = field(default_factory=dict)  # SHM_PHASES, empty where no shared memory
    shm_cpu_ms: float = 0.0  # CPU time of the shared-memory write and map (medians)

    @property
    def total_ms(self) -> float:
        """An update's data-plane cost through Redis: everything between its training and its place in the sum."""
        return sum(self.ms[phase] for phase in PHASES)

    @property
    def shm_total_ms(self) -> float:
        """The same through shared memory."""
        return sum(self.shm_ms[phase] for phase in SHM_PHASES)


def _timed_ms(
    call: Callable[[], Any],
    repeats: int,
    pick: Callable[[list[float]], float] = statistics.median,
    clock: Callable[[], float] = time.perf_counter,
) -> float:
    times = []
    for _ in range(repeats):
        began = clock()
        call()
        times.append((clock() - began) * 1000)
    return pick(times)


def fold_ms(state: Mapping[str, torch.Tensor], repeats: int = 3) -> float:
    """One more update's share of FedAvg's sum: fedavg over 3 updates less fedavg over 1, halved
    (the sum's fixed cost, its float64 copy of the global model and its result, is not an update's).
    The fastest try of each: a difference of two medians drowns in the noise of a busy machine."""
    from fedqueue.fl.ml.aggregate import fedavg

    local = {name: tensor.clone() for name, tensor in state.items()}
    one = [(0, 1, local)]
    three = [(device, 1, local) for device in range(3)]
    single = _timed_ms(lambda: fedavg(state, one, 1.0), repeats, min)
    triple = _timed_ms(lambda: fedavg(state, three, 1.0), repeats, min)
    return max(0.0, (triple - single) / 2)


def phase_costs(
    state: Mapping[str, torch.Tensor], client: redis.Redis, key_prefix: str, repeats: int = 3
) -> PhaseCosts:
    """Each phase of one update of `state` through `client`'s Redis, the median of `repeats` tries.

    The blob is written under `key_prefix` (with a random suffix) and deleted at the end.
    """
    from fedqueue.fl.ml.weights import decode_state, encode_state

    data = encode_state(dict(state))
    key = f"{key_prefix}:data-plane-probe:{uuid.uuid4().hex}"
    try:
        ms = {
            "encode": _timed_ms(lambda: encode_state(dict(state)), repeats),
            "hash": _timed_ms(lambda: hashlib.sha256(data).hexdigest(), repeats),
            "put": _timed_ms(lambda: client.set(key, data), repeats),
            "get": _timed_ms(lambda: client.get(key), repeats),
            "decode": _timed_ms(lambda: decode_state(data), repeats),
            "fold": fold_ms(state, repeats),
        }
    finally:
        client.delete(key)
    ms["hash again"] = ms["hash"]  # the reader checks the same bytes the writer hashed
    shm_ms, shm_cpu_ms = shm_phase_costs(state, client, key_prefix, repeats) if Path(SHM_DIR).is_dir() else ({}, 0.0)
    if shm_ms:
        shm_ms["fold"] = ms["fold"]
    return PhaseCosts(nbytes=len(data), ms=ms, shm_ms=shm_ms, shm_cpu_ms=shm_cpu_ms)


def shm_phase_costs(
    state: Mapping[str, torch.Tensor], client: redis.Redis, key_prefix: str, repeats: int
) -> tuple[dict[str, float], float]:
    """The write and the map of one update through a one-host shared-memory blob store (a folder of its own
    in SHM_DIR, removed at the end), each write over the file of the update before it as in a run: median wall
    ms of each, and their CPU ms together."""
    from fedqueue.core.broker.blobs import RedisBlobStore
    from fedqueue.core.broker.shm import SharedMemoryBlobStore
    from fedqueue.fl.worker.state_blobs import get_state, put_state, recycle_states

    root = Path(tempfile.mkdtemp(prefix="data-plane-probe-", dir=SHM_DIR))
    blobs = SharedMemoryBlobStore(root, RedisBlobStore(client, key_prefix, 600), one_host=True, ttl_s=600)
    local = dict(state)
    refs = []

    def write() -> None:
        if refs:  # as in a run: the last update freed, its file written over by the next
            recycle_states(blobs, [refs[-1].key])
        refs.append(put_state(blobs, f"probe/{uuid.uuid4().hex}", local))

    def read() -> None:
        for tensor in get_state(blobs, refs[-1]).values():
            if tensor.numel():
                tensor.reshape(-1)[:: max(1, 4096 // tensor.element_size())].sum()  # one read per page

    try:
        ms = {"write": _timed_ms(write, repeats), "map": _timed_ms(read, repeats)}
        cpu = _timed_ms(write, repeats, clock=time.process_time) + _timed_ms(read, repeats, clock=time.process_time)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return ms, cpu
