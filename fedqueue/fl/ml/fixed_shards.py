"""FedRevive's data: a fixed three-way split of the training set, then shards of exactly
`client_data_size` samples per device with per-device Dirichlet class proportions.

Shards overlap across devices (each class is dealt from a shuffled list with a cursor that wraps
around and reshuffles), never within one device. Same steps as FedRevive's `split_dirichlet`;
the random draws come from numpy's Generator seeded by the run, not from its global generators,
so the shards are not bit-for-bit theirs.
"""

from __future__ import annotations

import numpy as np
import torch

from fedqueue.errors import ConfigError, DataError

# FedRevive splits train / val / kd with a fixed generator, whatever the run's seed.
SPLIT_SEED = 42
SHARD_STREAM = 0xF1C5  # keeps the shards' draws apart from every other use of the run's seed


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


def _class_counts(proportions: np.ndarray, size: int, rng: np.random.Generator) -> np.ndarray:
    """Rounded shares of `size` (half to even), the deficit to one random class, the excess off the largest."""
    counts = np.round(proportions * size).astype(np.int64)
    deficit = size - int(counts.sum())
    if deficit > 0:
        counts[rng.integers(len(counts))] += deficit
    while counts.sum() > size:
        counts[int(np.argmax(counts))] -= 1  # ties: the lowest class, as numpy's argmax
    return counts


def fixed_size_shards(
    labels: np.ndarray, num_devices: int, size: int, alpha: float, num_classes: int, seed: int
) -> tuple[tuple[np.ndarray, ...], np.ndarray]:
    """(shards, proportions): `size` positions into `labels` per device, and each device's Dirichlet draw."""
    if size < 1:
        raise ConfigError(f"client_data_size: must be a positive integer, got {size}")
    labels = np.asarray(labels).reshape(-1)
    rng = np.random.default_rng([seed, SHARD_STREAM])
    members = [rng.permutation(np.flatnonzero(labels == label)) for label in range(num_classes)]
    used = [0] * num_classes
    shards, draws = [], np.zeros((num_devices, num_classes))
    for device in range(num_devices):
        draw = rng.dirichlet(np.full(num_classes, alpha))
        if not np.all(np.isfinite(draw)):  # tiny alphas can underflow: all to one class
            draw = np.eye(num_classes)[rng.integers(num_classes)]
        draws[device] = draw
        chosen = []
        for label, count in enumerate(_class_counts(draw, size, rng)):
            if count == 0:
                continue
            pool = members[label]
            if count > len(pool):
                raise DataError(
                    f"client_data_size: device {device} needs {count} samples of class {label},"
                    f" the training pool holds {len(pool)}"
                )
            if used[label] + count > len(pool):  # wrap around: a fresh order of the class
                members[label] = pool = rng.permutation(pool)
                used[label] = 0
            chosen.append(pool[used[label] : used[label] + count])
            used[label] += count
        shards.append(np.ascontiguousarray(np.concatenate(chosen), dtype=np.int64))
    return tuple(shards), draws
