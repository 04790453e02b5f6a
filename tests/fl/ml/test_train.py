from __future__ import annotations

import math
import threading
from collections.abc import Mapping
from typing import Any

import pytest
import torch
from torch import nn

from fedqueue.errors import ConfigError
from fedqueue.fl.ml.data import DataSpec, load_federated
from fedqueue.fl.ml.evaluate import evaluate
from fedqueue.fl.ml.models import build_model, initial_state
from fedqueue.fl.ml.plugins import TensorData
from fedqueue.fl.ml.train import LocalTrainConfig, TrainOutcome, train_local

CPU = torch.device("cpu")
SGD = LocalTrainConfig(local_iters=20, local_epochs=None, batch_size=16, optimizer="sgd", lr=0.05, momentum=0.9)


def _digits() -> TensorData:
    return load_federated(DataSpec(dataset="digits", seed=0)).train


def _model(name: str = "mlp", seed: int = 0) -> nn.Module:
    model = build_model(name, (1, 8, 8), 10)
    model.load_state_dict(initial_state(name, (1, 8, 8), 10, seed))
    return model


def _run(seed: int, cfg: LocalTrainConfig = SGD, name: str = "mlp") -> TrainOutcome:
    return train_local(_model(name), _digits(), cfg, seed, CPU)


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("name", ["mlp", "cnn"])
def test_same_seed_bit_identical_other_seed_differs(name: str) -> None:
    first, again, other = _run(7, name=name), _run(7, name=name), _run(8, name=name)
    assert _same(first.state, again.state)
    assert first.loss == again.loss
    assert not _same(first.state, other.state)


def test_adam_is_reproducible_too() -> None:
    cfg = LocalTrainConfig(10, None, 32, "adam", 1e-3, 0.0)
    first = _run(3, cfg).state
    assert _same(first, _run(3, cfg).state)
    # Adam trained: every weight tensor moved from where it started (an optimizer that never stepped leaves them all).
    initial = _model().state_dict()
    assert first.keys() == initial.keys()
    assert not any(torch.equal(first[key], initial[key]) for key in initial)


def test_global_rng_is_neither_used_nor_needed() -> None:
    model, data = _model(), _digits()  # building a model draws from the global RNG
    torch.manual_seed(1)
    before = torch.get_rng_state()
    first = train_local(model, data, SGD, 5, CPU)
    assert torch.equal(torch.get_rng_state(), before)
    model = _model()
    torch.manual_seed(2)
    assert _same(first.state, train_local(model, data, SGD, 5, CPU).state)


def test_threads_give_the_same_result_as_sequential_runs() -> None:
    expected = {seed: _run(seed).state for seed in (1, 2)}
    results: dict[int, dict[str, torch.Tensor]] = {}

    def work(seed: int) -> None:
        results[seed] = _run(seed).state

    threads = [threading.Thread(target=work, args=(seed,)) for seed in (1, 2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert all(_same(expected[seed], results[seed]) for seed in (1, 2))


def _count_batches(model: nn.Module) -> list[int]:
    sizes: list[int] = []
    model.register_forward_pre_hook(lambda _module, args: sizes.append(args[0].shape[0]))
    return sizes


def test_local_iters_is_the_number_of_steps() -> None:
    model = _model()
    sizes = _count_batches(model)
    small = TensorData(_digits().x[:40], _digits().y[:40])
    cfg = LocalTrainConfig(13, None, 16, "sgd", 0.01, 0.0)
    outcome = train_local(model, small, cfg, 0, CPU)
    assert outcome.steps == 13 == len(sizes)
    assert outcome.samples == 40
    # 40 samples in batches of 16 cycle as 16, 16, 8 per epoch.
    assert sizes[:6] == [16, 16, 8, 16, 16, 8]


def test_local_epochs_are_full_passes() -> None:
    model = _model()
    sizes = _count_batches(model)
    data = TensorData(_digits().x[:50], _digits().y[:50])
    cfg = LocalTrainConfig(None, 2, 64, "sgd", 0.01, 0.0)  # batch larger than the data
    outcome = train_local(model, data, cfg, 0, CPU)
    assert sizes == [50, 50]
    assert outcome.steps == 2
    cfg = LocalTrainConfig(None, 3, 16, "sgd", 0.01, 0.0)
    assert train_local(_model(), data, cfg, 0, CPU).steps == 3 * math.ceil(50 / 16)


def test_loss_decreases_on_digits() -> None:
    model = _model()
    data = _digits()
    _, loss_before = evaluate(model, data, CPU)
    first = train_local(model, data, SGD, 0, CPU)
    second = train_local(model, data, SGD, 1, CPU)
    _, loss_after = evaluate(model, data, CPU)
    assert second.loss < first.loss
    assert loss_after < loss_before
    assert first.loss < loss_before


def test_state_is_a_detached_cpu_copy() -> None:
    model = _model()
    outcome = train_local(model, _digits(), SGD, 0, CPU)
    assert _same(outcome.state, model.state_dict())
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(1.0)
    assert not _same(outcome.state, model.state_dict())
    assert all(t.device.type == "cpu" and t.is_contiguous() and not t.requires_grad for t in outcome.state.values())


def test_copy_out_false_gives_the_model_own_tensors_with_the_same_weights() -> None:
    copied = train_local(_model(), _digits(), SGD, 0, CPU)
    model = _model()
    held = train_local(model, _digits(), SGD, 0, CPU, copy_out=False)
    assert _same(held.state, copied.state)
    trained = model.state_dict()
    assert all(held.state[key].data_ptr() == trained[key].data_ptr() for key in trained)


class _Tied(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.first = nn.Linear(64, 64)
        self.second = nn.Linear(64, 10)
        self.echo = self.first  # the same weights under two names

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return self.second(torch.relu(self.echo(self.first(inputs.flatten(1)))))


def test_copy_out_false_copies_a_tensor_that_shares_storage() -> None:
    held = train_local(_Tied(), _digits(), SGD, 0, CPU, copy_out=False).state
    assert torch.equal(held["first.weight"], held["echo.weight"])
    assert held["first.weight"].data_ptr() != held["echo.weight"].data_ptr()


def test_a_plugin_step_still_sees_the_weights_the_device_started_from() -> None:
    model, seen = _model(), []
    start = {key: value.clone() for key, value in model.state_dict().items()}

    def step(
        model: nn.Module,
        batch: tuple[torch.Tensor, torch.Tensor],
        global_state: Mapping[str, torch.Tensor],
        options: Mapping[str, Any],
    ) -> torch.Tensor:
        seen.append(_same(dict(global_state), start))
        inputs, labels = batch
        return torch.nn.functional.cross_entropy(model(inputs), labels)

    train_local(model, _digits(), SGD, 0, CPU, step)
    assert len(seen) == SGD.local_iters and all(seen)


def test_bad_configs() -> None:
    with pytest.raises(ConfigError, match="local_iters"):
        _run(0, LocalTrainConfig(5, 1, 16, "sgd", 0.1, 0.0))
    with pytest.raises(ConfigError, match="local_iters"):
        _run(0, LocalTrainConfig(None, None, 16, "sgd", 0.1, 0.0))
    with pytest.raises(ConfigError, match="optimizer"):
        _run(0, LocalTrainConfig(5, None, 16, "rmsprop", 0.1, 0.0))
