"""FedRevive's data: a fixed three-way split of the training set, then shards of exactly
`client_data_size` samples per device with per-device Dirichlet class proportions.

Shards overlap across devices (each class is dealt from a shuffled list with a cursor that wraps
around and reshuffles), never within one device. Same steps as FedRevive's `split_dirichlet`;
the random draws come from numpy's Generator seeded by the run, not from its global generators,
so the shards are not bit-for-bit theirs.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Sequence
from typing import overload

import numpy as np
import torch

from fedqueue.errors import ConfigError, DataError

# FedRevive splits train / val / kd with a fixed generator, whatever the run's seed.
SPLIT_SEED = 42
SHARD_STREAM = 0xF1C5  # keeps the shards' draws apart from every other use of the run's seed
_BLOCK = 8192  # devices dealt at once: one gather each
# numpy's Dirichlet draws a gamma per class from this alpha on, stick-breaking betas below it.
DIRICHLET_BY_GAMMA = 0.1


def fixed_split(size: int, val_fraction: float, kd_fraction: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(train, val, kd) positions into a training set of `size`, as torch's random_split with seed 42 makes them.

    For CIFAR's 50,000 images with 0.15 and 0.1 these are FedRevive's exact 37,500 / 7,500 / 5,000.
    """
    val, kd = int(val_fraction * size), int(kd_fraction * size)
    train = size - val - kd
    if train < 1:
        raise ConfigError(f"val_split: val_split + kd_split leave no training samples of {size}")
    order = torch.randperm(size, generator=torch.Generator().manual_seed(SPLIT_SEED)).numpy().astype(np.int64)
    return order[:train], order[train : train + val], order[train + val :]


def class_counts(proportions: list[float], size: int, rng: np.random.Generator) -> list[int]:
    """Rounded shares of `size` (half to even), the deficit to one random class, the excess off the largest."""
    counts = [round(share * size) for share in proportions]  # as numpy's round: half to even
    deficit = size - sum(counts)
    if deficit > 0:
        counts[int(rng.integers(len(counts)))] += deficit
    while sum(counts) > size:
        counts[counts.index(max(counts))] -= 1  # ties: the lowest class
    return counts


class FixedShards(Sequence[np.ndarray]):
    """Every device's shard of exactly `size` positions into `labels`, dealt on first use.

    The deal is one random stream over the devices in order (a device's classes come after the previous
    devices' draws, and the cursors they moved), so device d is dealt with every device before it, and
    no further: a process that only asks for the first devices deals only those. Shards are kept as one
    table of `size` columns, dealt in blocks of devices, each block's slicing done in one numpy gather.
    """

    def __init__(
        self,
        labels: np.ndarray,
        num_devices: int,
        size: int,
        alpha: float,
        num_classes: int,
        seed: int,
        keep_draws: bool = False,
        into: np.ndarray | None = None,
    ) -> None:
        """`into`: positions the shards index (a shard holds `into[p]` for each drawn p; the default, p itself).
        `keep_draws`: keep each device's Dirichlet draw for `draws()` (tests; 8 bytes a class a device)."""
        if size < 1:
            raise ConfigError(f"client_data_size: must be a positive integer, got {size}")
        self.num_devices, self.size, self.num_classes = num_devices, size, num_classes
        labels = np.asarray(labels).reshape(-1)
        self._alpha = np.full(num_classes, alpha)
        self._rng = np.random.default_rng([seed, SHARD_STREAM])
        # Each class is dealt from its current order with a cursor; a wrap starts a fresh order (an epoch).
        self._orders = [self._rng.permutation(np.flatnonzero(labels == label)) for label in range(num_classes)]
        self._epochs = [0] * num_classes
        self._used = [0] * num_classes
        self._blocks: list[np.ndarray] = []
        self._draws: list[np.ndarray] = []
        self._dealt = 0
        self._keep_draws = keep_draws
        # 4 bytes a sample: a million devices of 20 samples are 80 MB.
        self._into = (np.arange(len(labels)) if into is None else np.asarray(into)).astype(np.int32)
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return self.num_devices

    @overload
    def __getitem__(self, device: int) -> np.ndarray: ...

    @overload
    def __getitem__(self, device: slice) -> Sequence[np.ndarray]: ...

    def __getitem__(self, device: int | slice) -> np.ndarray | Sequence[np.ndarray]:
        if isinstance(device, slice):
            return [self[index] for index in range(*device.indices(self.num_devices))]
        if not -self.num_devices <= device < self.num_devices:
            raise IndexError(f"device {device} out of range for {self.num_devices} devices")
        device %= self.num_devices
        self.deal_through(device)
        row: np.ndarray = self._blocks[device // _BLOCK][device % _BLOCK]
        return row

    def sizes(self) -> np.ndarray:
        """Every device's sample count, without dealing."""
        return np.full(self.num_devices, self.size, dtype=np.int64)

    def draws(self) -> np.ndarray:
        """Every device's Dirichlet class proportions (deals every device; needs keep_draws)."""
        if not self._keep_draws:
            raise ValueError("draws: the shards were dealt without keep_draws")
        self.deal_through(self.num_devices - 1)
        return np.concatenate(self._draws)

    def deal_through(self, device: int) -> None:
        """Deal the blocks up to and including the one that holds `device`."""
        with self._lock:
            while self._dealt <= device:
                count = min(_BLOCK, self.num_devices - self._dealt)
                block, draws = self._deal_block(self._dealt, count)
                block.setflags(write=False)  # rows are shared through the caches
                self._blocks.append(block)
                if draws is not None:
                    self._draws.append(draws)
                self._dealt += count

    def _dirichlet(self) -> list[float]:
        """rng.dirichlet(alpha, every class alike), a fifth of its cost: from alpha 0.1 on, numpy draws a
        gamma per class and scales them by 1 / their sum; its per-call checks dwarf the draws. Same stream,
        same floats (tests/fl/ml/test_fixed_shards.py holds it to rng.dirichlet)."""
        if self._alpha[0] < DIRICHLET_BY_GAMMA:
            shares: list[float] = self._rng.dirichlet(self._alpha).tolist()
            return shares
        gammas = self._rng.standard_gamma(float(self._alpha[0]), self.num_classes).tolist()
        total = 0.0
        for gamma in gammas:  # in order, as numpy adds them
            total += gamma
        if total == 0.0:
            return [math.nan] * self.num_classes
        scale = 1.0 / total
        return [gamma * scale for gamma in gammas]

    def _deal_block(self, first: int, count: int) -> tuple[np.ndarray, np.ndarray | None]:
        """`count` devices' shards from `first` on: the stream's draws per device, then one gather."""
        rng, size, classes = self._rng, self.size, self.num_classes
        lengths = [len(order) for order in self._orders]
        kept = [[order] for order in self._orders]  # each class's orders this block reads, oldest first
        start_epochs = list(self._epochs)
        epochs, used = self._epochs, self._used
        draws = np.empty((count, classes)) if self._keep_draws else None
        taken_class: list[int] = []
        taken_from: list[int] = []  # position in the class's orders of the block, laid end to end
        taken_count: list[int] = []
        for row in range(count):
            shares = self._dirichlet()
            if not math.isfinite(sum(shares)):  # tiny alphas can underflow (NaN): all to one class
                shares = [0.0] * classes
                shares[int(rng.integers(classes))] = 1.0
            if draws is not None:
                draws[row] = shares
            for label, wanted in enumerate(class_counts(shares, size, rng)):
                if wanted == 0:
                    continue
                if wanted > lengths[label]:
                    raise DataError(
                        f"client_data_size: device {first + row} needs {wanted} samples of class {label},"
                        f" the training pool holds {lengths[label]}"
                    )
                if used[label] + wanted > lengths[label]:  # wrap around: a fresh order of the class
                    fresh = rng.permutation(kept[label][-1])
                    kept[label].append(fresh)
                    epochs[label] += 1
                    used[label] = 0
                taken_class.append(label)
                taken_from.append((epochs[label] - start_epochs[label]) * lengths[label] + used[label])
                taken_count.append(wanted)
                used[label] += wanted
        self._orders = [orders[-1] for orders in kept]
        streams = [np.concatenate(orders) for orders in kept]
        offsets = np.cumsum([0] + [len(stream) for stream in streams[:-1]])
        counts = np.asarray(taken_count, dtype=np.int64)
        starts = offsets[np.asarray(taken_class, dtype=np.int64)] + np.asarray(taken_from, dtype=np.int64)
        ends = np.cumsum(counts)
        within = np.arange(count * size, dtype=np.int64) - np.repeat(ends - counts, counts)
        drawn = np.concatenate(streams)[np.repeat(starts, counts) + within]
        return self._into[drawn].reshape(count, size), draws


def fixed_size_shards(
    labels: np.ndarray, num_devices: int, size: int, alpha: float, num_classes: int, seed: int
) -> tuple[tuple[np.ndarray, ...], np.ndarray]:
    """(shards, proportions): `size` positions into `labels` per device, and each device's Dirichlet draw."""
    shards = FixedShards(labels, num_devices, size, alpha, num_classes, seed, keep_draws=True)
    return tuple(shards[device].astype(np.int64) for device in range(num_devices)), shards.draws()
