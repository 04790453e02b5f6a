"""partition = "dirichlet_fixed_per_device": each device's shard from (seed, device) alone."""

from __future__ import annotations

import numpy as np
import pytest

from fedqueue.config import Settings
from fedqueue.errors import ConfigError, DataError
from fedqueue.fl import api
from fedqueue.fl.ml.data import DataSpec, clear_caches, load_federated, partition_sizes
from fedqueue.fl.ml.device_shards import DeviceShards
from fedqueue.fl.ml.fixed_shards import fixed_split
from fedqueue.fl.store.results import device_tasks
from tests.conftest import running_workers
from tests.fl.ml.test_fixed_shards import assert_rounded
from tests.fl.strategy.fedbuff.test_buffered_async import assert_like_reference, buffered_config
from tests.support.helpers import small_config

LABELS = np.random.default_rng(0).integers(0, 10, size=3000)


def shards(devices: int = 40, seed: int = 3, size: int = 50) -> DeviceShards:
    return DeviceShards(LABELS, devices, size, 0.5, 10, seed)


def test_every_device_gets_exactly_client_data_size_of_its_rounded_draw_without_duplicates() -> None:
    lazy = shards()
    for device in range(40):
        part = lazy[device]
        assert len(part) == 50 and len(np.unique(part)) == 50 and part.min() >= 0 and part.max() < len(LABELS)
        assert_rounded(np.bincount(LABELS[part], minlength=10), lazy.shares(device), 50)
    joined = np.concatenate([shards(devices=200)[device] for device in range(200)])  # 10,000 of 3,000: overlap
    assert len(np.unique(joined)) < len(joined)


def test_a_shard_depends_on_the_seed_and_the_device_alone() -> None:
    alone = shards(devices=1_000_000)[999_999]
    again = shards(devices=1_000_000)
    for device in range(0, 1000, 7):  # other devices drawn first, in another order
        again[device]
    assert np.array_equal(again[999_999], alone) and np.array_equal(again[-1], alone)
    assert np.array_equal(shards(devices=10)[5], shards(devices=1_000_000)[5])  # nor on the device count
    assert not np.array_equal(shards(seed=4)[5], shards(seed=3)[5])
    assert not np.array_equal(shards()[5], shards()[6])
    with pytest.raises(IndexError, match="device 40 out of range"):
        shards()[40]


def test_nothing_is_kept_per_device() -> None:
    lazy = shards(devices=1_000_000)
    held = sum(members.nbytes for members in lazy._members)
    assert held == len(LABELS) * 8 and lazy.sizes().tolist()[:3] == [50, 50, 50]


def test_a_class_too_small_for_a_device_names_the_device() -> None:
    with pytest.raises(DataError, match="^client_data_size: device 0 needs"):
        DeviceShards(np.arange(20) % 10, 5, 20, 1e-6, 10, 0)[0]


def test_load_federated_draws_from_the_pool_left_after_val_and_kd() -> None:
    clear_caches()
    spec = DataSpec("digits", seed=1, num_devices=1_000_000, partition="dirichlet_fixed_per_device", alpha=0.5,
                    client_data_size=30, server_fraction=0.1, val_fraction=0.15, kd_fraction=0.1)  # fmt: skip
    data = load_federated(spec)
    assert isinstance(data.partitions, DeviceShards) and partition_sizes(data).tolist()[-1] == 30
    pool, _, kd = fixed_split(len(data.train), 0.15, 0.1)
    assert data.server is not None and np.array_equal(data.server, np.sort(kd))
    assert set(data.partitions[999_999].tolist()) <= set(pool.tolist())
    clear_caches()


def test_config_names_the_field() -> None:
    with pytest.raises(ConfigError, match='^client_data_size: required with partition = "dirichlet_fixed_per_device"'):
        small_config(partition="dirichlet_fixed_per_device")
    with pytest.raises(ConfigError, match="^samples_per_device:"):
        small_config(partition="dirichlet_fixed_per_device", client_data_size=10, samples_per_device=5)
    assert small_config(partition="dirichlet_fixed_per_device", client_data_size=10).data.fixed_shards


@pytest.mark.parametrize("procs", [1, 2])
def test_same_versions_and_weights_with_one_or_two_workers(settings: Settings, procs: int) -> None:
    config = buffered_config(num_devices=100_000, partition="dirichlet_fixed_per_device", client_data_size=20)
    with running_workers(settings, procs=procs):
        handle = api.submit(config, settings=settings)
        handle.wait(180)
    assert_like_reference(handle, config)
    if procs == 2:
        assert len({row.worker for row in device_tasks(handle.store, handle.id)}) == 2
