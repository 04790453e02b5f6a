"""partition = "dirichlet_fixed": FedRevive's split and its shards of exactly client_data_size samples."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedqueue.errors import ConfigError
from fedqueue.fl.ml.data import DataSpec, clear_caches, load_federated
from fedqueue.fl.ml.fixed_shards import fixed_size_shards, fixed_split
from tests.support.helpers import small_config

LABELS = np.random.default_rng(0).integers(0, 10, size=3000)


def shards(seed: int = 3, devices: int = 40, size: int = 50) -> tuple[tuple[np.ndarray, ...], np.ndarray]:
    return fixed_size_shards(LABELS, devices, size, 0.5, 10, seed)


def test_every_device_gets_exactly_client_data_size_without_duplicates() -> None:
    parts, _ = shards()
    assert [len(part) for part in parts] == [50] * 40
    assert all(len(np.unique(part)) == len(part) for part in parts)
    assert all(part.min() >= 0 and part.max() < len(LABELS) for part in parts)


def test_class_counts_are_the_rounded_draw() -> None:
    parts, draws = shards()
    for part, draw in zip(parts, draws, strict=True):
        counts = np.bincount(LABELS[part], minlength=10)
        rounded = np.round(draw * 50).astype(int)
        gap = 50 - int(rounded.sum())
        if gap >= 0:  # the whole deficit lands on one class
            moved = np.flatnonzero(counts != rounded)
            assert len(moved) <= 1 and (counts - rounded).sum() == gap
        else:  # the excess comes off the largest classes, one at a time
            assert np.all(counts <= rounded) and (rounded - counts).sum() == -gap
            assert np.all(counts[rounded > counts] >= counts.max() - 1)
    assert np.allclose(draws.sum(axis=1), 1.0)


def test_shards_overlap_across_devices() -> None:
    parts, _ = shards(devices=100)  # 5,000 draws from 3,000 samples: the cursors wrap around
    joined = np.concatenate(parts)
    assert len(np.unique(joined)) < len(joined)


def test_deterministic_from_the_seed_and_different_with_another() -> None:
    first, draws = shards(seed=3)
    again, same = shards(seed=3)
    other, _ = shards(seed=4)
    assert all(np.array_equal(a, b) for a, b in zip(first, again, strict=True)) and np.array_equal(draws, same)
    assert not all(np.array_equal(a, b) for a, b in zip(first, other, strict=True))


def test_the_split_is_torch_random_split_with_seed_42() -> None:
    train, val, kd = fixed_split(50_000, 0.15, 0.1)
    assert (len(train), len(val), len(kd)) == (37_500, 7_500, 5_000)
    # random_split takes a range as it takes a Dataset (its length, then Subsets of it); torch types only the latter.
    everything: torch.utils.data.Dataset[int] = range(50_000)  # type: ignore[assignment]
    parts = torch.utils.data.random_split(everything, [37_500, 7_500, 5_000], torch.Generator().manual_seed(42))
    assert [list(p.indices) for p in parts] == [train.tolist(), val.tolist(), kd.tolist()]


def test_load_federated_draws_from_the_pool_left_after_val_and_kd() -> None:
    clear_caches()
    spec = DataSpec("digits", seed=1, num_devices=20, partition="dirichlet_fixed", alpha=0.5, client_data_size=30,
                    server_fraction=0.1, val_fraction=0.15, kd_fraction=0.1)  # fmt: skip
    data = load_federated(spec)
    pool, val, kd = fixed_split(len(data.train), 0.15, 0.1)
    assert data.server is not None and np.array_equal(data.server, np.sort(kd))
    allowed = set(pool.tolist())
    assert all(len(part) == 30 and set(part.tolist()) <= allowed for part in data.partitions)


def test_config_names_the_field() -> None:
    with pytest.raises(ConfigError, match="^client_data_size: required"):
        small_config(partition="dirichlet_fixed")
    with pytest.raises(ConfigError, match="^client_data_size: applies"):
        small_config(client_data_size=10)
    with pytest.raises(ConfigError, match="^samples_per_device:"):
        small_config(partition="dirichlet_fixed", client_data_size=10, samples_per_device=5)
    with pytest.raises(ConfigError, match="^val_split:"):
        small_config(partition="dirichlet_fixed", client_data_size=10, val_split=0.95)
    config = small_config(partition="dirichlet_fixed", client_data_size=10)
    assert config.data.val_split == 0.15
