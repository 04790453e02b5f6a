"""Vmapped packs train each device as it would train alone, within float tolerance."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest
import torch
from torch import nn

from fedqueue.fl.ml.models import build_model, initial_state
from fedqueue.fl.ml.pack_train import train_pack, vmap_refusal
from fedqueue.fl.ml.plugins import TensorData
from fedqueue.fl.ml.train import LocalTrainConfig, TrainOutcome, train_local
from fedqueue.fl.packs.tasks import cut_packs

EXAMPLES = Path(__file__).resolve().parents[3] / "examples" / "plugins"

# Devices of 3 to 13 samples with batch 4: short last batches, and step counts from 1 to 4 per epoch.
SIZES = (5, 13, 3, 8, 10)
SHAPES = {"mlp": (1, 8, 8), "cnn": (3, 16, 16)}


def _datas(shape: tuple[int, ...]) -> list[TensorData]:
    generator = torch.Generator().manual_seed(3)
    return [
        TensorData(torch.rand(count, *shape, generator=generator), torch.randint(0, 10, (count,), generator=generator))
        for count in SIZES
    ]


def _train_both(
    name: str, cfg: LocalTrainConfig, step: object = None, options: dict[str, float] | None = None
) -> tuple[list[TrainOutcome], list[TrainOutcome], dict[str, torch.Tensor]]:
    torch.set_num_threads(1)
    shape = SHAPES[name]
    datas, state = _datas(shape), initial_state(name, shape, 10, seed=1)
    seeds = [100 + member for member in range(len(datas))]
    extra = {} if step is None else {"step": step, "options": options}
    alone = []
    for data, seed in zip(datas, seeds, strict=True):
        model = build_model(name, shape, 10)
        model.load_state_dict(state)
        alone.append(train_local(model, data, cfg, seed, torch.device("cpu"), **extra))  # type: ignore[arg-type]
    model = build_model(name, shape, 10)
    model.load_state_dict(state)
    together = train_pack(model, datas, cfg, seeds, torch.device("cpu"), **extra).outcomes()  # type: ignore[arg-type]
    return alone, together, state


def _assert_close(alone: list[TrainOutcome], together: list[TrainOutcome], atol: float) -> None:
    assert len(alone) == len(together)
    for member, (one, packed) in enumerate(zip(alone, together, strict=True)):
        assert (packed.samples, packed.steps) == (one.samples, one.steps), member
        assert packed.state.keys() == one.state.keys()
        for key in one.state:
            assert packed.state[key].shape == one.state[key].shape
            torch.testing.assert_close(packed.state[key], one.state[key], atol=atol, rtol=0, msg=f"{member} {key}")
        assert packed.loss == pytest.approx(one.loss, abs=1e-4)


def _assert_same_updates(
    alone: list[TrainOutcome], together: list[TrainOutcome], start: dict[str, torch.Tensor], rtol: float
) -> None:
    """Each device's update (trained minus start) differs by at most `rtol` of its size, tensor by tensor.

    Adam divides by the root of tiny second moments: a gradient of 1e-12 in one order of
    summation and 0 in the other moves one weight by a whole step, so single weights can
    differ by about the learning rate while the update as a whole agrees.
    """
    for member, (one, packed) in enumerate(zip(alone, together, strict=True)):
        assert (packed.samples, packed.steps) == (one.samples, one.steps), member
        for key, initial in start.items():
            update = one.state[key] - initial
            gap = float((packed.state[key] - one.state[key]).norm())
            assert gap <= rtol * float(update.norm()) + 1e-7, f"{member} {key}: {gap} vs {float(update.norm())}"


@pytest.mark.parametrize("name", ["mlp", "cnn"])
@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_vmapped_pack_equals_devices_trained_alone_with_sgd(name: str, momentum: float) -> None:
    """Different sizes give different step counts: a device done early must stop changing, momentum or not."""
    cfg = LocalTrainConfig(None, 2, 4, "sgd", 0.05, momentum)
    alone, together, _ = _train_both(name, cfg)
    assert len({outcome.steps for outcome in alone}) > 2  # the devices really stop at different steps
    _assert_close(alone, together, 1e-6)


@pytest.mark.parametrize("name", ["mlp", "cnn"])
def test_vmapped_pack_equals_devices_trained_alone_with_adam(name: str) -> None:
    cfg = LocalTrainConfig(None, 2, 4, "adam", 0.05, 0.0)
    alone, together, start = _train_both(name, cfg)
    _assert_same_updates(alone, together, start, rtol=0.01)


def test_a_device_done_early_keeps_its_weights_while_others_train() -> None:
    """With momentum, a device whose steps are over would drift if it took part in later optimizer steps."""
    cfg = LocalTrainConfig(None, 3, 4, "sgd", 0.1, 0.9)
    alone, together, _ = _train_both("mlp", cfg)
    early = min(range(len(SIZES)), key=lambda member: alone[member].steps)
    assert alone[early].steps < max(outcome.steps for outcome in alone)
    for key, value in alone[early].state.items():
        torch.testing.assert_close(together[early].state[key], value, atol=1e-6, rtol=0)


def test_fixed_local_iterations_and_a_plugin_step(monkeypatch: pytest.MonkeyPatch) -> None:
    """FedProx, written against model(inputs) and model.named_parameters(), runs unchanged in a pack."""
    monkeypatch.syspath_prepend(str(EXAMPLES))
    fedprox_step = importlib.import_module("fedqueue_examples.fedprox").fedprox_step
    cfg = LocalTrainConfig(6, None, 4, "sgd", 0.05, 0.5)
    alone, together, _ = _train_both("mlp", cfg, step=fedprox_step, options={"mu": 0.5})
    _assert_close(alone, together, 1e-6)


def test_models_with_running_statistics_or_dropout_are_refused() -> None:
    assert vmap_refusal(build_model("mlp", (1, 8, 8), 10)) is None
    assert vmap_refusal(build_model("cnn", (3, 16, 16), 10)) is None
    refusal = vmap_refusal(build_model("resnet18", (3, 16, 16), 10))
    assert refusal is not None and "BatchNorm running statistics" in refusal
    dropout = nn.Sequential(nn.Flatten(), nn.Dropout(0.2), nn.Linear(64, 10))
    assert vmap_refusal(dropout) == "the model has dropout (Dropout '1')"


@pytest.mark.parametrize(
    ("selected", "size", "packs"),
    [
        ([1, 4, 6, 9, 12], 2, [(1, 4), (6, 9), (12,)]),
        ([1, 4, 6], 1, [(1,), (4,), (6,)]),
        ([1, 4, 6], 5, [(1, 4, 6)]),
        # As few packs as fit, sizes one apart: two slots train 5 devices each, not 6 and 4 (3, 3, 3, 1).
        (list(range(10)), 3, [(0, 1, 2), (3, 4, 5), (6, 7), (8, 9)]),
        ([2, 3, 5, 7, 11, 13, 17], 3, [(2, 3, 5), (7, 11), (13, 17)]),
    ],
)
def test_packs_are_cut_from_the_sorted_selection(selected: list[int], size: int, packs: list[tuple[int, ...]]) -> None:
    assert cut_packs(selected, size) == packs


def test_a_pack_summed_for_fedavg_gives_fedavg_of_its_devices() -> None:
    """The pack's pre-summed update, averaged with a device stored alone, is FedAvg of all of them."""
    from fedqueue.fl.ml.aggregate import fedavg
    from fedqueue.fl.ml.pack_train import train_pack

    torch.set_num_threads(1)
    cfg = LocalTrainConfig(local_iters=3, local_epochs=None, batch_size=4, optimizer="sgd", lr=0.1, momentum=0.0)
    datas, state = _datas(SHAPES["mlp"]), initial_state("mlp", SHAPES["mlp"], 10, seed=1)
    model = build_model("mlp", SHAPES["mlp"], 10)
    # A buffer that training never changes, and a counter: averaged, they stay what they were.
    model.register_buffer("scale", torch.tensor([2.0, 3.0]))
    model.register_buffer("count", torch.tensor(7))
    state = {**state, "scale": torch.tensor([2.0, 3.0]), "count": torch.tensor(7)}
    model.load_state_dict(state)
    pack = train_pack(model, datas[1:], cfg, [1, 2, 3, 4], torch.device("cpu"))
    outcomes = pack.outcomes()
    assert [outcome.samples for outcome in outcomes] == list(SIZES[1:]) == pack.samples
    model.load_state_dict(state)
    alone = train_local(model, datas[0], cfg, 0, torch.device("cpu"))
    each = [(0, alone.samples, alone.state)] + [
        (device, outcome.samples, outcome.state) for device, outcome in enumerate(outcomes, start=1)
    ]
    summed = fedavg(
        state, [(0, alone.samples, alone.state)], 0.5, sums=[(1, sum(SIZES[1:]), pack.weighted_delta_sum())]
    )
    expected = fedavg(state, each, 0.5)
    for key, value in expected.items():
        torch.testing.assert_close(summed[key], value, atol=1e-7, rtol=0, msg=key)
    assert torch.equal(summed["scale"], state["scale"]) and int(summed["count"]) == 7
    # Not vacuous: the pack's devices moved the model.
    assert any(not torch.equal(summed[key], fedavg(state, each[:1], 0.5)[key]) for key in state)
