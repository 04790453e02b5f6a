"""dataset = "cifar100" from local files, and per-class (label_wise) evaluation."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from fedqueue.errors import DataError
from fedqueue.fl.ml.cifar_fixture import write_cifar100_files
from fedqueue.fl.ml.data import DataSpec, clear_caches, load_federated
from fedqueue.fl.ml.evaluate import evaluate, evaluate_by_class
from fedqueue.fl.ml.plugins import TensorData


def test_cifar100_reads_torchvision_s_layout_and_never_downloads(tmp_path: Path) -> None:
    clear_caches()
    write_cifar100_files(tmp_path, train_samples=400, test_samples=200)
    data = load_federated(DataSpec("cifar100", root=str(tmp_path), num_devices=4))
    assert data.num_classes == 100 and data.input_shape == (3, 32, 32)
    assert len(data.train) == 400 and len(data.test) == 200
    assert int(data.train.y.max()) == 99
    with pytest.raises(DataError, match="cifar-100-python"):
        load_federated(DataSpec("cifar100", root=str(tmp_path / "cifar-100-python"), num_devices=4))


def test_per_class_accuracy_and_loss() -> None:
    class Fixed(torch.nn.Module):  # predicts class 0 for everything
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.tensor([2.0, 0.0, 0.0]).expand(len(x), 3)

    data = TensorData(torch.zeros(5, 1), torch.tensor([0, 0, 1, 1, 1]))
    result = evaluate_by_class(Fixed(), data, torch.device("cpu"), 3, batch_size=2)
    assert result.accuracy == pytest.approx(0.4) and result.class_accuracy == [1.0, 0.0, None]
    loss_right = float(torch.nn.functional.cross_entropy(torch.tensor([[2.0, 0.0, 0.0]]), torch.tensor([0])))
    loss_wrong = float(torch.nn.functional.cross_entropy(torch.tensor([[2.0, 0.0, 0.0]]), torch.tensor([1])))
    assert result.class_loss[0] == pytest.approx(loss_right) and result.class_loss[1] == pytest.approx(loss_wrong)
    assert result.class_loss[2] is None
    assert evaluate(Fixed(), data, torch.device("cpu"), batch_size=2) == (result.accuracy, result.loss)
    assert result.label_wise() == {"accuracy": [1.0, 0.0, None], "loss": result.class_loss}
