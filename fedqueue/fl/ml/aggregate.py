"""Federated averaging: pure, and bit-identical whatever order the updates arrived in."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar, overload

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

# An update as FedAvgSum folds it: (device, samples, weights), and whether it is a pack's pre-summed share.
Share = tuple[Update, bool]


class FedAvgSum:
    """FedAvg's float64 sum over a round's updates, folded a few at a time in device order, then stepped.

    sum = sum_i samples_i x (float64(local_i) - float64(global)): each difference rounded once, then added with
    its count as add_'s alpha (`sum.add_(difference, alpha=samples)`, whole tensors or slices alike), in
    device order (floating-point sums depend on order: a fixed one makes the result reproducible); a pack's
    pre-summed share (its worker's sum of the same terms, in float64) is added as it is, in the order of its
    lowest device. The total of samples divides only at the step, so a sync round can fold the updates already
    stored while its last devices still train (fedqueue.fl.strategy.sync.read_ahead). Non-floating tensors
    (counters such as BatchNorm's num_batches_tracked) come from the lowest device. Give it back (`step` or
    `discard`): its sums are kept for the next fold.
    """

    def __init__(self, global_state: Mapping[str, Tensor]) -> None:
        self.global_state = global_state
        # The global weights are read in float32 (or their own dtype) and widened slice by slice, exactly.
        self._base = {name: value.detach() for name, value in global_state.items() if value.is_floating_point()}
        self._sums: dict[str, Tensor] | None = _KEPT_SUMS.take(global_state)
        self._counters: dict[str, Tensor] = {}
        self.folded: list[tuple[int, int, bool]] = []  # (device, samples, pre-summed) in the order folded
        self.samples = 0

    def fold(self, shares: Sequence[Share], threads: int | None = None) -> None:
        """Add `shares` (devices above every one folded so far, in device order) to the sum, over `threads`."""
        if self._sums is None:
            raise RuntimeError("this FedAvg sum was already stepped or discarded")
        last = self.folded[-1][0] if self.folded else None
        for (device, samples, _), _summed in shares:
            if last is not None and device <= last:
                raise ValueError(f"fedavg got device {device} after device {last}: updates fold in device order")
            if samples < 0:
                raise ValueError(f"device {device} reported {samples} samples")
            last = device
        counts = [None if summed else samples for (_, samples, _), summed in shares]
        for name, current in self.global_state.items():
            values = [_local(device, state, name, current).detach() for (device, _, state), _ in shares]
            if name in self._base:
                in_parts(_add_shares(counts), self._sums[name], self._base[name], *values, threads=threads)
            elif not self.folded and values:
                self._counters[name] = values[0].clone()
        for (device, samples, _), summed in shares:
            self.folded.append((device, samples, summed))
            self.samples += samples

    def step(self, global_lr: float) -> dict[str, Tensor]:
        """global + (global_lr / total samples) x sum, in each tensor's dtype."""
        if not self.folded:
            raise ValueError("fedavg needs at least one update")
        if self.samples <= 0:
            raise ValueError("fedavg updates carry no samples")
        sums = self._give_back()
        scale = global_lr / self.samples
        stepped = {
            name: self._counters[name] if name not in self._base else _stepped(self._base[name], sums[name], scale)
            for name in self.global_state
        }
        _KEPT_SUMS.give_back(sums)
        return stepped

    def discard(self) -> None:
        """Give the sums back unused (a fold that will not be stepped)."""
        if self._sums is not None:
            _KEPT_SUMS.give_back(self._give_back())

    def _give_back(self) -> dict[str, Tensor]:
        sums, self._sums = self._sums, None
        if sums is None:
            raise RuntimeError("this FedAvg sum was already stepped or discarded")
        return sums


def _add_shares(counts: Sequence[int | None]) -> Callable[..., None]:
    """into += samples x (float64(local) - float64(base)) for a device alone (its count given, as add_'s alpha),
    into += its float64 sum for a pack (None), each in turn, a slice at a time: add(into, base, *values)."""

    def add(into: Tensor, base: Tensor, *values: Tensor) -> None:
        scratch = _thread_scratch(into.device)
        for part, before, *inputs in sliced(into, base, *values):
            wide = scratch.widened(before) if any(samples is not None for samples in counts) else before
            for samples, value in zip(counts, inputs, strict=True):
                if samples is None:
                    part.add_(value)
                else:
                    # add_'s alpha: the count taken in the addition (one fused rounding on a CPU, as written).
                    part.add_(scratch.minus(value, wide), alpha=samples)

    return add


def in_device_order(updates: Sequence[Update], sums: Sequence[Update] = ()) -> list[tuple[bool, int]]:
    """(pre-summed, position in `sums` or `updates`) of every update, by (lowest) device; refuses a device twice
    (`FedAvgSum.fold` refuses a negative sample count)."""
    alone = [device for device, _ in counts_of(updates)]
    packs = [device for device, _ in counts_of(sums)]
    both = set(alone) & set(packs)
    if both:
        raise ValueError(f"fedavg got device {min(both)} alone and in a pre-summed pack")
    for devices in (alone, packs):
        if len(set(devices)) != len(devices):
            raise ValueError(f"fedavg got more than one update from a device: {sorted(devices)}")
    entries = [(device, False, position) for position, device in enumerate(alone)]
    entries += [(device, True, position) for position, device in enumerate(packs)]
    return [(summed, position) for _, summed, position in sorted(entries)]


def fedavg(
    global_state: Mapping[str, Tensor],
    updates: Sequence[Update],
    global_lr: float,
    sums: Sequence[Update] = (),
) -> dict[str, Tensor]:
    """global + global_lr * sample-weighted mean of (local - global), per tensor (`FedAvgSum`).

    updates are (device_id, num_samples, local_state), each indexed once, in device order
    (so a `LoadedOnUse` round is read one update at a time). `sums` are packs pre-summed by
    their worker: (lowest device, the pack's samples, sum of samples x (local - global) in
    float64, non-floating tensors of its lowest device).
    """
    order = in_device_order(updates, sums)
    if not order:
        raise ValueError("fedavg needs at least one update")
    folding = FedAvgSum(global_state)
    group = fold_group(global_state)
    try:
        for first in range(0, len(order), group):
            # A few updates at a time: a slice of the sum takes each one's share while it is in the cache.
            members = order[first : first + group]
            folding.fold([((sums if summed else updates)[position], summed) for summed, position in members])
    except BaseException:
        folding.discard()
        raise
    return folding.step(global_lr)


def fedavg_rule(
    global_state: Mapping[str, Tensor], updates: Sequence[Update], global_lr: float, options: Options
) -> dict[str, Tensor]:
    """Built-in aggregation rule: `fedavg` behind the plugin signature."""
    return fedavg(global_state, updates, global_lr)


_Item = TypeVar("_Item")

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
    The same bits as fold_deltas over each update's float64 change, with no state-sized copy per update;
    a group of updates is folded a slice at a time, over threads, as FedAvg's are.
    """
    total = _KEPT_SUMS.take(current)
    count = 0
    for members in _groups(buffer, fold_group(current)):
        count += len(members)
        weights = [weight for weight, _, _ in members]
        for name, into in total.items():
            pairs = [
                tensor
                for _, trained_from, local in members
                for tensor in (_matching(local, name, into), _matching(trained_from, name, into))
            ]
            in_parts(_add_weighted_changes(weights), into, *pairs)
    return _folded(current, total, count, global_lr)


def fold_deltas(current: Mapping[str, Tensor], buffer: Iterable[WeightedDelta], global_lr: float) -> dict[str, Tensor]:
    """current + global_lr * sum_i w_i * delta_i / n, summed in float64 in the order given."""
    total = _KEPT_SUMS.take(current)
    count = 0
    for members in _groups(buffer, fold_group(current)):
        count += len(members)
        weights = [weight for weight, _ in members]
        for name, into in total.items():
            in_parts(_add_weighted(weights), into, *(_matching(delta, name, into) for _, delta in members))
    return _folded(current, total, count, global_lr)


def _groups(items: Iterable[_Item], size: int) -> Iterator[list[_Item]]:
    """`items` in lists of `size` (the last may be shorter), read as they are reached."""
    group: list[_Item] = []
    for item in items:
        group.append(item)
        if len(group) == size:
            yield group
            group = []
    if group:
        yield group


def _matching(state: Mapping[str, Tensor], name: str, like: Tensor) -> Tensor:
    tensor = state[name].detach()
    if tensor.numel() != like.numel():
        raise ValueError(f"{name!r} has {tensor.numel()} elements where {like.numel()} were expected")
    return tensor


def _add_weighted_changes(weights: Sequence[float]) -> Callable[..., None]:
    """into += weight * (float64(local) - float64(base)) for each (local, base) in turn, the weight taken by
    add_'s alpha, a slice at a time: called as add(into, local, base, local, base, ...)."""

    def add(into: Tensor, *pairs: Tensor) -> None:
        scratch = _thread_scratch(into.device)
        for part, *inputs in sliced(into, *pairs):
            for weight, trained, before in zip(weights, inputs[0::2], inputs[1::2], strict=True):
                part.add_(scratch.difference(trained, before), alpha=weight)

    return add


def _add_weighted(weights: Sequence[float]) -> Callable[..., None]:
    """into += weight * float64(change) for each change in turn (add_'s alpha), a slice at a time."""

    def add(into: Tensor, *changes: Tensor) -> None:
        scratch = _thread_scratch(into.device)
        for part, *parts in sliced(into, *changes):
            for weight, change in zip(weights, parts, strict=True):
                part.add_(scratch.of(change), alpha=weight)

    return add


class _KeptSums:
    """The float64 sums of a process's last fold on a CPU, kept for its next: fresh memory costs its pages on
    first touch (zeroing a new 90 MB sum took 34-35 ms of one core on a 2-core EPYC, zeroing a kept one 4), and
    a sync round's fold runs while every other slot waits for it. One set, taken by one fold at a time (a fold
    that finds it taken, or of other shapes, makes its own), and at most `_KEPT_SUMS_MAX_BYTES`."""

    def __init__(self) -> None:
        self._kept: dict[str, Tensor] | None = None
        self._lock = threading.Lock()

    def take(self, current: Mapping[str, Tensor]) -> dict[str, Tensor]:
        """A float64 sum of zeros for each floating tensor of `current`."""
        shapes = {name: value for name, value in current.items() if value.is_floating_point()}
        with self._lock:
            kept, self._kept = self._kept, None
        if kept is not None and _same_shapes(kept, shapes):
            for total in kept.values():
                in_parts(_zeroed, total)
            return kept
        return {
            name: torch.zeros(value.shape, dtype=torch.float64, device=value.device) for name, value in shapes.items()
        }

    def give_back(self, sums: dict[str, Tensor]) -> None:
        """Keep a fold's spent sums for the next (on a CPU, within the cap)."""
        values = list(sums.values())
        if not values or any(value.device.type != "cpu" for value in values):
            return  # a GPU's caching allocator already reuses its memory
        if sum(value.numel() * value.element_size() for value in values) > _KEPT_SUMS_MAX_BYTES:
            return
        with self._lock:
            self._kept = sums


def _same_shapes(kept: Mapping[str, Tensor], current: Mapping[str, Tensor]) -> bool:
    return kept.keys() == current.keys() and all(
        kept[name].shape == value.shape and kept[name].device == value.device for name, value in current.items()
    )


def _zeroed(into: Tensor) -> None:
    into.zero_()


_KEPT_SUMS_MAX_BYTES = 1 << 30
_KEPT_SUMS = _KeptSums()


def _forget_kept_sums() -> None:
    """In a forked child: sums of its own (the parent's would be shared copy-on-write, its lock maybe held)."""
    global _KEPT_SUMS
    _KEPT_SUMS = _KeptSums()


os.register_at_fork(after_in_child=_forget_kept_sums)


def _folded(current: Mapping[str, Tensor], total: dict[str, Tensor], count: int, global_lr: float) -> dict[str, Tensor]:
    if count == 0:
        raise ValueError("fold_deltas needs at least one update")
    stepped = {
        name: value.clone() if name not in total else _stepped(value.detach(), total[name], global_lr / count)
        for name, value in current.items()
    }
    _KEPT_SUMS.give_back(total)
    return stepped


# Elements per slice of the float64 arithmetic: a slice's operands stay in the CPU's cache between its
# operations, where each operation over a whole 45 MB state (90 MB in float64) goes through memory. A
# multiple of every vector width, so each element takes the path it takes in one operation over the whole
# tensor (vectorized, or the scalar tail): the same bits. 131,072 elements (1 MiB in float64): a group of 10
# updates of 11.2M floats folded in 255 ms on one core of a 2-core EPYC (1 MiB L2, 32 MiB L3), 305 at 32,768,
# 440-545 at a million; fewer torch calls a slice, each still cached.
_SLICE = 1 << 17


def sliced(into: Tensor, *inputs: Tensor) -> Iterator[tuple[Tensor, ...]]:
    """The same slice of `into` (a view: writes reach it) and of each input, a cache-sized slice at a time."""
    flat = [into.view(-1), *(tensor.reshape(-1) for tensor in inputs)]
    size = flat[0].numel()
    for tensor in flat[1:]:
        if tensor.numel() != size:
            raise ValueError(f"a tensor of {tensor.numel()} elements where {size} were expected")
    step = _SLICE if into.device.type == "cpu" else max(size, 1)  # a GPU runs each operation whole
    for start in range(0, size, step):
        yield tuple(tensor[start : start + step] for tensor in flat)


class Scratch:
    """Float64 slices reused for every operation: no allocation per update, tensor or slice."""

    def __init__(self) -> None:
        self._buffer: Tensor | None = None
        self._wide: Tensor | None = None  # a base slice widened once for a group's updates

    def of(self, part: Tensor) -> Tensor:
        """`part` widened to float64 (exactly), in the scratch slice."""
        return self._slice(part).copy_(part)

    def difference(self, local: Tensor, base: Tensor) -> Tensor:
        """float64(local) - float64(base), rounded once, in the scratch slice."""
        return self.of(local).sub_(base)

    def widened(self, base: Tensor) -> Tensor:
        """`base` in float64, in a slice of its own, for `minus` to take from many updates."""
        size = base.numel()
        if self._wide is None or self._wide.numel() < size or self._wide.device != base.device:
            self._wide = torch.empty(max(size, _SLICE), dtype=torch.float64, device=base.device)
        return self._wide[:size].copy_(base)

    def minus(self, local: Tensor, wide: Tensor) -> Tensor:
        """float64(local) - wide (a `widened` base), rounded once, in the scratch slice: the same bits as
        `difference`, in one operation (the float64 operand makes torch widen `local` as it reads it)."""
        return torch.sub(local, wide, out=self._slice(local))

    def _slice(self, part: Tensor) -> Tensor:
        size = part.numel()
        if self._buffer is None or self._buffer.numel() < size or self._buffer.device != part.device:
            self._buffer = torch.empty(max(size, _SLICE), dtype=torch.float64, device=part.device)
        return self._buffer[:size]


_scratches = threading.local()


def _thread_scratch(device: torch.device) -> Scratch:
    """On a CPU, this thread's scratch slice: one per aggregation thread, not one per part, tensor and update.
    A GPU works each tensor whole: its scratch (a tensor's size) is not kept."""
    if device.type != "cpu":
        return Scratch()
    scratch: Scratch | None = getattr(_scratches, "scratch", None)
    if scratch is None:
        scratch = _scratches.scratch = Scratch()
    return scratch


def _stepped(base: Tensor, total: Tensor, scale: float) -> Tensor:
    """base + scale * total (total's float64, then base's dtype), a new contiguous tensor; `total` is spent."""
    out = torch.empty(base.shape, dtype=base.dtype, device=base.device)

    def step(into: Tensor, summed_part: Tensor, base_part: Tensor) -> None:
        for part, summed, before in sliced(into, summed_part, base_part):
            # scale * total, then + base: the two roundings of base + scale * total (addition commutes exactly).
            part.copy_(summed.mul_(scale).add_(before))

    in_parts(step, out, total, base)
    return out


# Updates a fold holds at once (so a slice of the float64 sum takes their shares while it is in the cache): as
# many as fit this many bytes, within these bounds. A LoadedOnUse round reads them a group at a time.
FOLD_GROUP_BYTES = 256 << 20
FOLD_GROUP_MAX = 16


def fold_group(state: Mapping[str, Tensor]) -> int:
    nbytes = sum(tensor.numel() * tensor.element_size() for tensor in state.values())
    return max(1, min(FOLD_GROUP_MAX, FOLD_GROUP_BYTES // max(nbytes, 1)))


# Threads a CPU aggregation's float64 arithmetic is split over. Each element's arithmetic is the same in any
# thread, so the bits do not depend on the count; a sync round's aggregation runs while every other slot
# waits for it, so its arithmetic alone would leave cores idle.
AGGREGATION_THREADS = max(1, min(4, os.cpu_count() or 1))
_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def _threads() -> ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=AGGREGATION_THREADS, thread_name_prefix="aggregation")
        return _pool


def _forget_threads() -> None:
    """In a forked child (a prefork worker's slot): the parent's threads are not there, so a pool of its own."""
    global _pool, _pool_lock
    _pool, _pool_lock = None, threading.Lock()


os.register_at_fork(after_in_child=_forget_threads)


def in_parts(work: Callable[..., None], into: Tensor, *inputs: Tensor, threads: int | None = None) -> None:
    """work(into's part, each input's part) over contiguous parts, one per thread, on a CPU.

    Parts are whole multiples of the slice (`sliced`), so each element takes the path it takes in one pass; a
    GPU tensor, or one of a few slices, is one part, worked in this thread. `into` must be contiguous."""
    size = into.numel()
    parts = min(threads or AGGREGATION_THREADS, size // _SLICE) if into.device.type == "cpu" else 1
    if parts <= 1:
        work(into, *inputs)
        return
    flat = [into.view(-1), *(tensor.reshape(-1) for tensor in inputs)]
    step = -(-size // parts // _SLICE) * _SLICE
    futures = [
        _threads().submit(work, *(tensor[start : start + step] for tensor in flat)) for start in range(0, size, step)
    ]
    for future in futures:
        future.result()
