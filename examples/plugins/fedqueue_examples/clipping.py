"""Norm-clipped FedAvg: a server-side rule that bounds how far one device can move the model.

Each device's change (its weights minus the global ones, over all floating tensors) is
scaled down to an L2 norm of at most `clip_norm` before the sample-weighted mean: a
guard against outlier or hostile devices, and the first step of central differential
privacy. A device within the bound is used unchanged, so with a large `clip_norm` this
is FedAvg bit for bit.

    aggregate = "fedqueue_examples.clipping:clipped_fedavg"
    [plugin]
    clip_norm = 1.0

It goes through the round's updates once, one at a time, as fedqueue reads them: a
round of any size fits in memory.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from torch import Tensor

from fedqueue.fl.ml.aggregate import LoadedOnUse, counts_of, fedavg
from fedqueue.fl.ml.plugins import Update


def validate_options(options: dict[str, Any]) -> None:
    """fedqueue calls this at submit time: a bad `clip_norm` is refused before anything is enqueued."""
    clip_norm = options.get("clip_norm", 1.0)
    if isinstance(clip_norm, bool) or not isinstance(clip_norm, (int, float)) or not clip_norm > 0:
        raise ValueError(f"clip_norm must be a number > 0, got {clip_norm!r}")


def clip_update(
    global_state: Mapping[str, Tensor], local: Mapping[str, Tensor], clip_norm: float
) -> Mapping[str, Tensor]:
    """`local`, moved back towards `global_state` until its change has an L2 norm of at most `clip_norm`."""
    floating = [name for name, value in global_state.items() if value.is_floating_point()]
    squared = sum(float((local[name].double() - global_state[name].double()).pow(2).sum()) for name in floating)
    norm = squared**0.5
    if norm <= clip_norm:
        return local
    scale = clip_norm / norm
    clipped = dict(local)
    for name in floating:
        base = global_state[name].double()
        clipped[name] = (base + (local[name].double() - base) * scale).to(local[name].dtype)
    return clipped


def clipped_fedavg(
    global_state: Mapping[str, Tensor], updates: Sequence[Update], global_lr: float, options: Mapping[str, Any]
) -> dict[str, Tensor]:
    clip_norm = float(options.get("clip_norm", 1.0))
    clipped = LoadedOnUse(
        counts_of(updates), lambda position: clip_update(global_state, updates[position][2], clip_norm)
    )
    return fedavg(global_state, clipped, global_lr)


clipped_fedavg.validate_options = validate_options  # type: ignore[attr-defined]
