"""Federated averaging: pure, and bit-identical whatever order the updates arrived in."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import Tensor

from fedqueue.fl.plugins import Options, Update


def _ordered(updates: Sequence[Update]) -> list[Update]:
    if not updates:
        raise ValueError("fedavg needs at least one update")
    # Floating-point sums depend on order; a fixed order makes the result reproducible.
    ordered = sorted(updates, key=lambda update: update[0])
    devices = [device for device, _, _ in ordered]
    if len(set(devices)) != len(devices):
        raise ValueError(f"fedavg got more than one update from a device: {devices}")
    for device, samples, _ in ordered:
        if samples < 0:
            raise ValueError(f"device {device} reported {samples} samples")
    if sum(samples for _, samples, _ in ordered) <= 0:
        raise ValueError("fedavg updates carry no samples")
    return ordered


def _local(device: int, state: Mapping[str, Tensor], name: str, like: Tensor) -> Tensor:
    if name not in state:
        raise ValueError(f"device {device}'s update has no {name!r}")
    tensor = state[name]
    if tensor.shape != like.shape:
        raise ValueError(
            f"device {device}'s {name!r} has shape {tuple(tensor.shape)},"
            f" expected {tuple(like.shape)}"
        )
    return tensor


def fedavg(
    global_state: Mapping[str, Tensor],
    updates: Sequence[Update],
    global_lr: float,
) -> dict[str, Tensor]:
    """global + global_lr * sample-weighted mean of (local - global), per tensor.

    updates are (device_id, num_samples, local_state). Non-floating tensors (counters
    such as BatchNorm's num_batches_tracked) come from the lowest device id.
    """
    ordered = _ordered(updates)
    total = sum(samples for _, samples, _ in ordered)
    result: dict[str, Tensor] = {}
    for name, current in global_state.items():
        if not current.is_floating_point():
            first_device, _, first_state = ordered[0]
            result[name] = _local(first_device, first_state, name, current).detach().clone()
            continue
        # float64 accumulation keeps low-precision weights from drifting through the sum.
        base = current.detach().to(torch.float64)
        delta = torch.zeros_like(base)
        for device, samples, state in ordered:
            local = _local(device, state, name, current).detach()
            delta += (samples / total) * (local.to(device=base.device, dtype=torch.float64) - base)
        result[name] = (base + global_lr * delta).to(current.dtype).contiguous()
    return result


def fedavg_rule(
    global_state: Mapping[str, Tensor], updates: Sequence[Update], global_lr: float, options: Options
) -> dict[str, Tensor]:
    """Built-in aggregation rule: `fedavg` behind the plugin signature."""
    return fedavg(global_state, updates, global_lr)
