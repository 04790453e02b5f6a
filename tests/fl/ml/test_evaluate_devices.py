from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fedqueue.fl.ml import torch_device as devices
from fedqueue.fl.ml.evaluate import evaluate
from fedqueue.fl.ml.plugins import TensorData


def test_evaluate_matches_a_direct_computation_across_batches() -> None:
    generator = torch.Generator().manual_seed(0)
    model = nn.Linear(5, 3)
    x = torch.randn(50, 5, generator=generator)
    data = TensorData(x, torch.randint(0, 3, (50,), generator=generator))
    with torch.no_grad():
        logits = model(data.x)
    expected_acc = float((logits.argmax(1) == data.y).float().mean())
    expected_loss = float(F.cross_entropy(logits, data.y))
    accuracy, loss = evaluate(model, data, torch.device("cpu"), batch_size=7)
    assert accuracy == pytest.approx(expected_acc)
    assert loss == pytest.approx(expected_loss, rel=1e-5)
    assert not model.training


def test_cpu_when_no_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert devices.torch_device() == torch.device("cpu")
    assert devices.device_label() == "cpu"


def test_gpu_label_names_the_physical_index(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert devices.torch_device() == torch.device("cuda:0")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    assert devices.device_label() == "cuda:3"
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert devices.device_label() == "cuda:0"


def test_configure_determinism_on_cpu_only_sets_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[bool] = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch, "use_deterministic_algorithms", lambda mode: calls.append(mode))
    threads = torch.get_num_threads()
    try:
        devices.configure_determinism(1)
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(threads)
    assert calls == []


def test_configure_determinism_on_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[bool] = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch, "use_deterministic_algorithms", lambda mode: calls.append(mode))
    monkeypatch.setattr(torch.backends.cudnn, "benchmark", True)
    monkeypatch.setattr(torch.backends.cudnn, "deterministic", False)
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", "placeholder")
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG")
    threads = torch.get_num_threads()
    try:
        devices.configure_determinism(threads)
    finally:
        torch.set_num_threads(threads)
    assert calls == [True]
    assert torch.backends.cudnn.benchmark is False
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
