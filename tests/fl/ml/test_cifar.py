from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest
import torch

from fedqueue.errors import DataError
from fedqueue.fl.ml.cifar_fixture import write_cifar_batches
from fedqueue.fl.ml.data import DataSpec, load_federated

MEAN = torch.tensor((0.4914, 0.4822, 0.4465)).view(1, 3, 1, 1)
STD = torch.tensor((0.2023, 0.1994, 0.2010)).view(1, 3, 1, 1)


def _read(folder: Path, names: list[str]) -> tuple[np.ndarray, list[int]]:
    data, labels = [], []
    for name in names:
        with (folder / name).open("rb") as handle:
            entry = pickle.load(handle)
        data.append(entry["data"])
        labels.extend(entry["labels"])
    return np.concatenate(data), labels


def test_fixture_round_trips_through_the_loader(tmp_path: Path) -> None:
    folder = write_cifar_batches(tmp_path, train_samples=53, test_samples=11, seed=1)
    assert folder == tmp_path / "cifar-10-batches-py"
    fed = load_federated(DataSpec(dataset="cifar10", root=str(tmp_path), num_devices=2))

    assert fed.input_shape == (3, 32, 32) and fed.num_classes == 10
    assert fed.train.x.dtype == torch.float32 and fed.train.y.dtype == torch.int64
    train_names = [f"data_batch_{i}" for i in range(1, 6)]
    for split, names in ((fed.train, train_names), (fed.test, ["test_batch"])):
        raw, labels = _read(folder, names)
        assert split.y.tolist() == labels
        pixels = torch.from_numpy(raw).view(-1, 3, 32, 32).float() / 255.0
        assert torch.allclose(split.x, (pixels - MEAN) / STD, atol=1e-5)
    assert sum(len(p) for p in fed.partitions) == 53


def test_fixture_batches_hold_the_requested_counts(tmp_path: Path) -> None:
    folder = write_cifar_batches(tmp_path, train_samples=12, test_samples=3)
    raw, labels = _read(folder, [f"data_batch_{i}" for i in range(1, 6)])
    assert raw.shape == (12, 3072) and raw.dtype == np.uint8 and len(labels) == 12
    with (folder / "batches.meta").open("rb") as handle:
        assert len(pickle.load(handle)["label_names"]) == 10


def test_missing_root_names_the_path(tmp_path: Path) -> None:
    root = str(tmp_path / "nowhere")
    with pytest.raises(DataError) as caught:
        load_federated(DataSpec(dataset="cifar10", root=root))
    assert root in str(caught.value)
    with pytest.raises(DataError, match="does not exist"):
        load_federated(DataSpec(dataset="cifar10", root=None))


def test_root_without_batches_names_the_path(tmp_path: Path) -> None:
    with pytest.raises(DataError) as caught:
        load_federated(DataSpec(dataset="cifar10", root=str(tmp_path)))
    assert str(tmp_path) in str(caught.value)


def test_corrupt_batch_is_a_data_error(tmp_path: Path) -> None:
    folder = write_cifar_batches(tmp_path, train_samples=10, test_samples=2)
    (folder / "data_batch_1").write_bytes(b"not a pickle")
    with pytest.raises(DataError) as caught:
        load_federated(DataSpec(dataset="cifar10", root=str(tmp_path)))
    assert str(tmp_path) in str(caught.value)


def test_the_cifar10_example_reads_its_batches_from_data_cifar10(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """examples/cifar10_fedavg.toml, run where ./data/cifar10 holds the batches (as in docker compose)."""
    from fedqueue.fl.config import load_run_config
    from fedqueue.fl.setup import data_spec

    example = Path(__file__).resolve().parents[3] / "examples" / "cifar10_fedavg.toml"
    write_cifar_batches(tmp_path / "data" / "cifar10", train_samples=2000, test_samples=100)
    monkeypatch.chdir(tmp_path)
    config = load_run_config(example)
    data = load_federated(data_spec(config))
    assert len(data.partitions) == config.num_devices == 100 and data.input_shape == (3, 32, 32)
    assert sum(len(part) for part in data.partitions) == 2000
