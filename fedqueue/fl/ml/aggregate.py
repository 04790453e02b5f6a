"""Federated averaging: pure, and bit-identical whatever order the updates arrived in."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import overload

import torch
from torch import Tensor

from fedqueue.fl.ml.plugins import Options, Update


class LoadedOnUse(Sequence[Update]):
    """Updates whose weights are read (from the blob store) when they are indexed.

    Aggregating a round this way holds a few updates at a time, so a round's memory does
    not grow with its number of devices. Devices and sample counts are known up front.
    Indexed in order, the next `read_ahead` updates are read by background threads while
    the current one is summed: fetching and checking blobs overlaps the arithmetic.
    With `load_many`, updates are read `chunk` at a time (one round trip for many small
    updates); the caller sizes `chunk` so that a few chunks fit in memory.
    Use it as a context manager, so reads still under way are dropped at the end.
    """

    def __init__(
        self,
        counts: Sequence[tuple[int, int]],
        load: Callable[[int], Mapping[str, Tensor]],
        read_ahead: int = 0,
        *,
        load_many: Callable[[Sequence[int]], list[Mapping[str, Tensor]]] | None = None,
        chunk: int = 1,
    ) -> None:
        self.counts = list(counts)
        self._load_many = load_many or (lambda positions: [load(position) for position in positions])
        self._chunk = max(1, chunk)
        self._chunks_ahead = -(-read_ahead // self._chunk)  # ceil: at least one chunk when reading ahead
        self._pending: dict[int, Future[list[Mapping[str, Tensor]]]] = {}
        self._current: tuple[int, list[Mapping[str, Tensor]]] | None = None
        self._readers = ThreadPoolExecutor(max_workers=2, thread_name_prefix="update-reader") if read_ahead else None

    def __enter__(self) -> LoadedOnUse:
        return self

    def __exit__(self, *_: object) -> None:
        if self._readers is not None:
            for future in self._pending.values():
                future.cancel()
            self._pending.clear()
            self._readers.shutdown(wait=True)
        self._current = None

    def _read_chunk(self, index: int) -> list[Mapping[str, Tensor]]:
        start = index * self._chunk
        return self._load_many(range(start, min(start + self._chunk, len(self))))

    def _state(self, position: int) -> Mapping[str, Tensor]:
        index = position // self._chunk
        if self._current is not None and self._current[0] == index:
            return self._current[1][position % self._chunk]
        self._current = None  # the chunk before is done with: let it go before reading the next
        if self._readers is None:
            states = self._read_chunk(index)
        else:
            last = (len(self) - 1) // self._chunk
            for ahead in range(index + 1, min(index + 1 + self._chunks_ahead, last + 1)):
                if ahead not in self._pending:
                    self._pending[ahead] = self._readers.submit(self._read_chunk, ahead)
            pending = self._pending.pop(index, None)
            states = pending.result() if pending is not None else self._read_chunk(index)
        self._current = (index, states)
        return states[position % self._chunk]

    def __len__(self) -> int:
        return len(self.counts)

    @overload
    def __getitem__(self, index: int) -> Update: ...

    @overload
    def __getitem__(self, index: slice) -> list[Update]: ...

    def __getitem__(self, index: int | slice) -> Update | list[Update]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        device, samples = self.counts[index]
        return device, samples, self._state(index if index >= 0 else index + len(self))


def counts_of(updates: Sequence[Update]) -> list[tuple[int, int]]:
    """(device, samples) of every update, without reading any weights of a `LoadedOnUse`."""
    return list(updates.counts) if isinstance(updates, LoadedOnUse) else [(d, s) for d, s, _ in updates]


def _order(updates: Sequence[Update]) -> tuple[list[int], int]:
    """Positions of the updates by device id, and their total samples; refuses what FedAvg cannot use."""
    counts = counts_of(updates)
    # Floating-point sums depend on order; a fixed order makes the result reproducible.
    order = sorted(range(len(counts)), key=lambda position: counts[position][0])
    devices = [counts[position][0] for position in order]
    if len(set(devices)) != len(devices):
        raise ValueError(f"fedavg got more than one update from a device: {devices}")
    for device, samples in counts:
        if samples < 0:
            raise ValueError(f"device {device} reported {samples} samples")
    return order, sum(samples for _, samples in counts)


def _local(device: int, state: Mapping[str, Tensor], name: str, like: Tensor) -> Tensor:
    if name not in state:
        raise ValueError(f"device {device}'s update has no {name!r}")
    tensor = state[name]
    if tensor.shape != like.shape:
        raise ValueError(f"device {device}'s {name!r} has shape {tuple(tensor.shape)}, expected {tuple(like.shape)}")
    return tensor


# Rules whose result a pack's devices can pre-sum: FedAvg is linear in the updates. Rules that
# need every update apart (clipping, a median, any plugin) read one update per device.
SUMMABLE_RULES = ("fedavg",)


def fedavg(
    global_state: Mapping[str, Tensor],
    updates: Sequence[Update],
    global_lr: float,
    sums: Sequence[Update] = (),
) -> dict[str, Tensor]:
    """global + global_lr * sample-weighted mean of (local - global), per tensor.

    updates are (device_id, num_samples, local_state), each indexed once, in device order
    (so a `LoadedOnUse` round is read one update at a time). Non-floating tensors
    (counters such as BatchNorm's num_batches_tracked) come from the lowest device id.
    `sums` are packs pre-summed by their worker: (lowest device, the pack's samples,
    sum of samples x (local - global) in float64, non-floating tensors of its lowest device).
    """
    order, total = _order(updates)
    sum_order, summed_total = _order(sums)
    total += summed_total
    if not order and not sum_order:
        raise ValueError("fedavg needs at least one update")
    if total <= 0:
        raise ValueError("fedavg updates carry no samples")
    lowest = min((device for device, _ in counts_of(updates)), default=None)
    lowest_summed = min((device for device, _ in counts_of(sums)), default=None)
    if lowest is not None and lowest == lowest_summed:
        raise ValueError(f"fedavg got device {lowest} alone and in a pre-summed pack")
    counters_from_sum = lowest is None or (lowest_summed is not None and lowest_summed < lowest)
    # float64 accumulation keeps low-precision weights from drifting through the sum.
    base = {
        name: current.detach().to(torch.float64)
        for name, current in global_state.items()
        if current.is_floating_point()
    }
    delta = {name: torch.zeros_like(value) for name, value in base.items()}
    # One scratch buffer per tensor, reused for every update: no allocation per update and tensor.
    scratch = {name: torch.empty_like(value) for name, value in base.items()}
    counters: dict[str, Tensor] = {}
    for rank, position in enumerate(order):
        device, samples, state = updates[position]
        for name, current in global_state.items():
            local = _local(device, state, name, current).detach()
            if name in base:
                # delta += (samples / total) * (local - base), one rounding per operation as written.
                difference = scratch[name].copy_(local).sub_(base[name])
                delta[name].add_(difference.mul_(samples / total))
            elif rank == 0 and not counters_from_sum:
                counters[name] = local.clone()
    for rank, position in enumerate(sum_order):
        device, _, state = sums[position]
        for name, current in global_state.items():
            summed = _local(device, state, name, current).detach()
            if name in base:
                delta[name].add_(scratch[name].copy_(summed).div_(total))
            elif rank == 0 and counters_from_sum:
                counters[name] = summed.clone()
    return {
        name: counters[name]
        if name not in base
        else (base[name] + global_lr * delta[name]).to(current.dtype).contiguous()
        for name, current in global_state.items()
    }


def fedavg_rule(
    global_state: Mapping[str, Tensor], updates: Sequence[Update], global_lr: float, options: Options
) -> dict[str, Tensor]:
    """Built-in aggregation rule: `fedavg` behind the plugin signature."""
    return fedavg(global_state, updates, global_lr)


# (staleness weight, the version it trained from, its trained weights)
WeightedUpdate = tuple[float, Mapping[str, Tensor], Mapping[str, Tensor]]
# (staleness weight, the update's change in float64, by tensor name)
WeightedDelta = tuple[float, Mapping[str, Tensor]]


def fold_buffer(current: Mapping[str, Tensor], buffer: Iterable[WeightedUpdate], global_lr: float) -> dict[str, Tensor]:
    """FedBuff's server step: current + global_lr * sum_i w_i * (local_i - base_i) / n.

    Each update's change is taken from the version it trained on (base_i), which may be older than
    `current`; the sum runs in float64 in the order given (simulated arrival), and is divided by the
    number of updates n, not by the weights' sum (as FedBuff and NVIDIA FLARE's edge manager do), so
    stale updates shrink the step. Non-floating tensors (counters) are kept from `current`.
    """

    def deltas() -> Iterable[WeightedDelta]:
        for weight, trained_from, local in buffer:
            yield (
                weight,
                {
                    name: local[name].detach().to(torch.float64) - trained_from[name].detach().to(torch.float64)
                    for name, value in current.items()
                    if value.is_floating_point()
                },
            )

    return fold_deltas(current, deltas(), global_lr)


def fold_deltas(current: Mapping[str, Tensor], buffer: Iterable[WeightedDelta], global_lr: float) -> dict[str, Tensor]:
    """current + global_lr * sum_i w_i * delta_i / n, summed in float64 in the order given."""
    base = {name: t.detach().to(torch.float64) for name, t in current.items() if t.is_floating_point()}
    total = {name: torch.zeros_like(value) for name, value in base.items()}
    count = 0
    for weight, delta in buffer:
        count += 1
        for name in base:
            total[name].add_(delta[name].to(torch.float64), alpha=weight)
    if count == 0:
        raise ValueError("fold_deltas needs at least one update")
    return {
        name: value.clone()
        if name not in base
        else (base[name] + (global_lr / count) * total[name]).to(value.dtype).contiguous()
        for name, value in current.items()
    }
