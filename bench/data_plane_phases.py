"""What one update's trip costs, phase by phase, timed on the library calls fedqueue makes for it.

A worker encodes its trained state (safetensors), hashes it (sha256) and SETs it into Redis; the
aggregator GETs it, hashes it again, decodes it and folds it into the round's sum. The store's
timing rows give load, compute and upload per task and the aggregation per round, not these
phases apart: here each is timed alone, in this process, on a state of the size at hand.
"""

from __future__ import annotations

import hashlib
import statistics
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import redis
    import torch

# The phases an update crosses between the end of its training and its fold, in order.
PHASES = ("encode", "hash", "put", "get", "hash again", "decode", "fold")


@dataclass(frozen=True)
class PhaseCosts:
    """Median milliseconds of each phase for one update of `nbytes` encoded bytes."""

    nbytes: int
    ms: dict[str, float]

    @property
    def total_ms(self) -> float:
        """An update's data-plane cost: everything between its training and its place in the sum."""
        return sum(self.ms[phase] for phase in PHASES)


def _timed_ms(call: Callable[[], Any], repeats: int, pick: Callable[[list[float]], float] = statistics.median) -> float:
    times = []
    for _ in range(repeats):
        began = time.perf_counter()
        call()
        times.append((time.perf_counter() - began) * 1000)
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
    return PhaseCosts(nbytes=len(data), ms=ms)
