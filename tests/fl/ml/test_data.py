from __future__ import annotations

import numpy as np
import pytest
import torch

from fedqueue.errors import ConfigError
from fedqueue.fl.ml.data import DataSpec, device_data, load_federated
from fedqueue.fl.ml.evaluate import evaluate
from fedqueue.fl.ml.models import build_model
from fedqueue.fl.ml.train import LocalTrainConfig, train_local

CPU = torch.device("cpu")


def test_digits_shapes_split_and_classes() -> None:
    fed = load_federated(DataSpec(dataset="digits", seed=0, num_devices=4))
    assert fed.input_shape == (1, 8, 8)
    assert fed.num_classes == 10
    assert fed.train.x.dtype == torch.float32 and fed.train.y.dtype == torch.int64
    assert tuple(fed.train.x.shape[1:]) == (1, 8, 8)
    assert len(fed.train) + len(fed.test) == 1797
    assert abs(len(fed.test) / 1797 - 0.2) < 0.01
    assert float(fed.train.x.min()) >= 0.0 and float(fed.train.x.max()) <= 1.0
    assert set(fed.train.y.tolist()) == set(range(10)) == set(fed.test.y.tolist())
    assert len(fed.partitions) == 4


def test_digits_split_depends_on_seed() -> None:
    first = load_federated(DataSpec(dataset="digits", seed=1))
    other = load_federated(DataSpec(dataset="digits", seed=2))
    assert not torch.equal(first.test.x, other.test.x)
    again = load_federated(DataSpec(dataset="digits", seed=1, num_devices=2))
    assert torch.equal(first.test.x, again.test.x)


def test_digits_are_real_data_an_mlp_learns() -> None:
    fed = load_federated(DataSpec(dataset="digits", seed=0))
    torch.manual_seed(0)
    model = build_model("mlp", fed.input_shape, fed.num_classes)
    cfg = LocalTrainConfig(None, 15, 32, "adam", 3e-3, 0.0)
    train_local(model, fed.train, cfg, seed=0, device=CPU)
    accuracy, _ = evaluate(model, fed.test, CPU)
    assert accuracy > 0.9


def test_load_is_cached_per_spec() -> None:
    spec = DataSpec(dataset="digits", seed=3, num_devices=3)
    assert load_federated(spec) is load_federated(DataSpec(dataset="digits", seed=3, num_devices=3))
    assert load_federated(spec) is not load_federated(DataSpec(dataset="digits", seed=3))


def test_device_data_is_that_devices_slice() -> None:
    spec = DataSpec(dataset="digits", seed=0, num_devices=5, partition="dirichlet", alpha=0.3)
    fed = load_federated(spec)
    for device in range(5):
        local = device_data(spec, device)
        index = torch.from_numpy(fed.partitions[device].copy())
        assert torch.equal(local.x, fed.train.x[index])
        assert torch.equal(local.y, fed.train.y[index])
        assert local.x.is_contiguous() and local.y.is_contiguous()
    assert device_data(spec, 2) is device_data(spec, 2)
    with pytest.raises(IndexError):
        device_data(spec, 5)


def test_samples_per_device_caps_each_device() -> None:
    spec = DataSpec(dataset="digits", seed=0, num_devices=3, samples_per_device=17)
    assert [len(device_data(spec, d)) for d in range(3)] == [17, 17, 17]


def test_synthetic_shapes_and_seeded() -> None:
    fed = load_federated(DataSpec(dataset="synthetic", seed=5))
    assert fed.input_shape == (3, 32, 32)
    assert (len(fed.train), len(fed.test)) == (4000, 1000)
    assert set(fed.train.y.tolist()) == set(range(10))
    same = load_federated(DataSpec(dataset="synthetic", seed=5, num_devices=2))
    other = load_federated(DataSpec(dataset="synthetic", seed=6))
    assert torch.equal(fed.train.x, same.train.x)
    assert not torch.equal(fed.train.x, other.train.x)


def test_synthetic_grows_to_fit_the_devices() -> None:
    spec = DataSpec(dataset="synthetic", seed=0, num_devices=9, samples_per_device=500)
    fed = load_federated(spec)
    assert len(fed.train) >= 4500
    assert all(len(part) == 500 for part in fed.partitions)


def test_synthetic_is_learnable() -> None:
    fed = load_federated(DataSpec(dataset="synthetic", seed=0))
    torch.manual_seed(0)
    model = build_model("mlp", fed.input_shape, fed.num_classes)
    cfg = LocalTrainConfig(60, None, 32, "sgd", 0.01, 0.9)
    train_local(model, fed.train, cfg, seed=0, device=CPU)
    accuracy, _ = evaluate(model, fed.test, CPU)
    assert accuracy > 0.5  # chance is 0.1


def test_unknown_names_raise_config_error() -> None:
    with pytest.raises(ConfigError, match=r"^dataset: .*'mnist'"):
        load_federated(DataSpec(dataset="mnist"))
    with pytest.raises(ConfigError, match=r"^partition: .*'shards'"):
        load_federated(DataSpec(dataset="digits", partition="shards"))
    with pytest.raises(ConfigError, match=r"^num_devices"):
        load_federated(DataSpec(dataset="digits", num_devices=0))


def test_partition_matches_partition_indices() -> None:
    from fedqueue.fl.ml.data import partition_indices

    spec = DataSpec(dataset="digits", seed=4, num_devices=6, partition="dirichlet", alpha=0.5)
    fed = load_federated(spec)
    expected = partition_indices(fed.train.y.numpy(), 6, "dirichlet", 0.5, 4, None)
    assert all(np.array_equal(a, b) for a, b in zip(fed.partitions, expected, strict=True))


def test_server_split_is_held_out_of_every_partition() -> None:
    """A kd_split holds a seeded share of the training set for the server; the devices share the rest."""
    from fedqueue.fl.ml.data import DataSpec, load_federated

    plain = load_federated(DataSpec(dataset="digits", num_devices=20, seed=3))
    spec = DataSpec(dataset="digits", num_devices=20, seed=3, server_fraction=0.1)
    held = load_federated(spec)
    assert plain.server is None and held.server is not None
    assert len(held.server) == round(0.1 * len(held.train))
    given = np.concatenate(held.partitions)
    assert not set(given.tolist()) & set(held.server.tolist())
    assert len(given) + len(held.server) == len(held.train)
    again = load_federated(DataSpec(dataset="digits", num_devices=20, seed=3, server_fraction=0.1)).server
    assert again is not None and np.array_equal(again, held.server)
