"""partition = "dirichlet_fixed": FedRevive's split and its shards of exactly client_data_size samples."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import fedqueue.fl.ml.fixed_shards as fixed_shards
from fedqueue.errors import ConfigError, DataError
from fedqueue.fl.ml.data import DataSpec, clear_caches, load_federated, partition_sizes
from fedqueue.fl.ml.fixed_shards import SHARD_STREAM, FixedShards, fixed_size_shards, fixed_split
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
        assert_rounded(np.bincount(LABELS[part], minlength=10), draw, 50)
    assert np.allclose(draws.sum(axis=1), 1.0)


def assert_rounded(counts: np.ndarray, draw: np.ndarray, size: int) -> None:
    """A shard's class counts are its Dirichlet draw times `size`, rounded as FedRevive rounds them."""
    rounded = np.round(draw * size).astype(int)
    gap = size - int(rounded.sum())
    if gap >= 0:  # the whole deficit lands on one class
        moved = np.flatnonzero(counts != rounded)
        assert len(moved) <= 1 and (counts - rounded).sum() == gap
    else:  # the excess comes off the largest classes, one at a time
        assert np.all(counts <= rounded) and (rounded - counts).sum() == -gap
        assert np.all(counts[rounded > counts] >= counts.max() - 1)


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


def plain_deal(labels: np.ndarray, devices: int, size: int, alpha: float, seed: int) -> list[np.ndarray]:
    """The deal as one loop over the devices with numpy's own Dirichlet: what the shards were first drawn by."""
    rng = np.random.default_rng([seed, SHARD_STREAM])
    members = [rng.permutation(np.flatnonzero(labels == label)) for label in range(10)]
    used = [0] * 10
    shards = []
    for _ in range(devices):
        draw = rng.dirichlet(np.full(10, alpha))
        if not np.all(np.isfinite(draw)):
            draw = np.eye(10)[rng.integers(10)]
        counts = np.round(draw * size).astype(np.int64)
        if size - counts.sum() > 0:
            counts[rng.integers(10)] += size - counts.sum()
        while counts.sum() > size:
            counts[int(np.argmax(counts))] -= 1
        chosen = []
        for label, count in enumerate(counts):
            if count == 0:
                continue
            if used[label] + count > len(members[label]):
                members[label] = rng.permutation(members[label])
                used[label] = 0
            chosen.append(members[label][used[label] : used[label] + count])
            used[label] += count
        shards.append(np.concatenate(chosen))
    return shards


@pytest.mark.parametrize("alpha", [0.5, 0.1, 0.05, 1e-6, 5.0])
@pytest.mark.parametrize("block", [8192, 7])
def test_the_deal_is_the_plain_loop_whatever_the_alpha_and_block(
    alpha: float, block: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 300 samples, 200 devices of 20: every class wraps around many times, within blocks and across them.
    monkeypatch.setattr(fixed_shards, "_BLOCK", block)
    labels = LABELS[:300]
    dealt, _ = fixed_size_shards(labels, 200, 20, alpha, 10, 5)
    expected = plain_deal(labels, 200, 20, alpha, 5)
    assert all(np.array_equal(a, b) for a, b in zip(dealt, expected, strict=True))


def test_a_device_is_dealt_with_the_devices_before_it_and_no_further(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fixed_shards, "_BLOCK", 16)
    lazy = FixedShards(LABELS, 1000, 20, 0.5, 10, 3, into=np.arange(len(LABELS)) + 7)
    assert lazy.sizes().tolist() == [20] * 1000
    first = lazy[40]
    assert len(lazy._blocks) == 3  # devices 0-47: three blocks of 16, not the 63 of all 1,000
    whole, _ = fixed_size_shards(LABELS, 1000, 20, 0.5, 10, 3)
    assert np.array_equal(first, whole[40] + 7) and np.array_equal(lazy[-1], whole[999] + 7)
    with pytest.raises(IndexError, match="device 1000 out of range"):
        lazy[1000]


def test_a_class_too_small_for_a_device_names_the_device() -> None:
    with pytest.raises(DataError, match="^client_data_size: device 0 needs"):
        FixedShards(np.arange(20) % 10, 5, 20, 1e-6, 10, 0)[0]


def test_load_federated_leaves_the_shards_undealt_until_a_device_is_read() -> None:
    clear_caches()
    spec = DataSpec("digits", num_devices=200_000, partition="dirichlet_fixed", client_data_size=20)
    data = load_federated(spec)
    assert isinstance(data.partitions, FixedShards) and not data.partitions._blocks
    assert partition_sizes(data).tolist() == [20] * 200_000 and not data.partitions._blocks
    assert len(data.partitions[3]) == 20 and len(data.partitions._blocks) == 1
    clear_caches()
