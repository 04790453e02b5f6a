"""The data-free synthesizer: pool growth, determinism, exact resume, learning, feature statistics."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fedqueue.fl.ml.models import build_model
from fedqueue.fl.ml.synthesis import SynthesisSettings, Synthesizer, image_shape
from fedqueue.fl.ml.teacher_stack import TeacherStack

SMALL = SynthesisSettings(nz=8, ngf=8, synth_batch_size=8, g_steps=2, warmup_rounds=1, pool_size=20)
UNIFORM = np.full(10, 0.1)


def synthesize(
    synth: Synthesizer, teachers: list[nn.Module], proportions: list[np.ndarray], student: nn.Module, current_round: int
) -> dict[str, float]:
    parts = synth.synthesize(TeacherStack(teachers), torch.as_tensor(np.stack(proportions)), student, current_round)
    return {name: float(value) for name, value in parts.items()}


def teacher(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return build_model("cnn", (1, 8, 8), 10)


def test_each_call_adds_a_batch_of_model_inputs_and_the_pool_is_bounded() -> None:
    torch.manual_seed(0)
    synth = Synthesizer(SMALL, (64,), 10)  # a flat input: drawn as 8x8, handed back flat
    models = [build_model("mlp", (64,), 10)]
    for calls in range(1, 4):
        synthesize(synth, models, [UNIFORM], build_model("mlp", (64,), 10), calls)
        inputs, labels = synth.pool()
        assert inputs.shape == (min(8 * calls, 20), 64) and labels.shape == (len(inputs),)
    assert int(labels.min()) >= 0 and int(labels.max()) < 10


def test_labels_follow_the_teachers_classes() -> None:
    torch.manual_seed(0)
    synth = Synthesizer(SMALL, (1, 8, 8), 10)
    only_three = np.eye(10)[3]
    synthesize(synth, [teacher()], [only_three], teacher(1), 0)
    assert set(synth.pool()[1].tolist()) == {3}


def run(seed: int, calls: int, synth: Synthesizer | None = None) -> Synthesizer:
    if synth is None:
        torch.manual_seed(seed)
        synth = Synthesizer(SMALL, (1, 8, 8), 10)
    for call in range(calls):
        torch.manual_seed(seed * 100 + call)
        synthesize(synth, [teacher(1), teacher(2)], [UNIFORM, np.eye(10)[0]], teacher(3), call)
    return synth


def assert_same_state(left: Synthesizer, right: Synthesizer) -> None:
    a, b = left.state_dict(), right.state_dict()
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name


def test_same_seed_same_images_and_a_saved_state_continues_exactly() -> None:
    assert_same_state(run(0, 3), run(0, 3))
    assert not torch.equal(run(0, 3).pool()[0], run(1, 3).pool()[0])
    # Stop after two calls, load into a new synthesizer, make the third call there.
    halfway = run(0, 2)
    torch.manual_seed(99)  # construction draws weights that the loaded state replaces
    resumed = Synthesizer(SMALL, (1, 8, 8), 10)
    resumed.load_state_dict(halfway.state_dict())
    for call in (2,):
        torch.manual_seed(0 * 100 + call)
        synthesize(resumed, [teacher(1), teacher(2)], [UNIFORM, np.eye(10)[0]], teacher(3), call)
    assert_same_state(resumed, run(0, 3))


def test_the_generator_learns_images_the_teacher_labels_as_asked() -> None:
    """A trained teacher: its cross-entropy on new images for their labels falls as the generator learns."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    x = torch.as_tensor(digits.images / 16.0, dtype=torch.float32).unsqueeze(1)
    y = torch.as_tensor(digits.target)
    torch.manual_seed(0)
    model = build_model("mlp", (1, 8, 8), 10)  # trains in a second, where the cnn takes half a minute
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    for _ in range(60):
        optimizer.zero_grad()
        F.cross_entropy(model(x), y).backward()
        optimizer.step()
    settings = SynthesisSettings(nz=16, ngf=16, synth_batch_size=32, g_steps=5, lr_g=0.01, lr_z=0.01, adv=0.0)
    for seed in (0, 1):
        torch.manual_seed(seed)
        synth = Synthesizer(settings, (1, 8, 8), 10)
        losses = [synthesize(synth, [model], [UNIFORM], teacher(5), 0)["oh"] for _ in range(15)]
        assert np.mean(losses[-5:]) < 0.5 * np.mean(losses[:5]), losses


def test_feature_statistics_count_only_batchnorm_layers() -> None:
    inputs = torch.randn(8, 1, 8, 8)
    plain = TeacherStack([teacher(), teacher(1)])
    assert not plain.has_statistics and torch.equal(plain.ask(inputs)[1], torch.zeros(2))  # no BatchNorm: 0
    normed = [
        nn.Sequential(nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4), nn.Flatten(), nn.Linear(144, 6), nn.BatchNorm1d(6))
        for _ in range(2)
    ]
    stack = TeacherStack(normed)
    _, distances = stack.ask(inputs)
    # By hand, for the first teacher: each BatchNorm's input statistics against its running ones.
    features = normed[0][0](inputs)
    expected = torch.tensor(0.0)
    for layer, seen in ((normed[0][1], features), (normed[0][4], normed[0][3](normed[0][2](normed[0][1](features))))):
        dims = [0] if seen.dim() == 2 else [0, 2, 3]
        expected = expected + torch.linalg.vector_norm(layer.running_var - seen.var(dim=dims, unbiased=False))
        expected = expected + torch.linalg.vector_norm(layer.running_mean - seen.mean(dim=dims))
    assert stack.has_statistics and float(distances[0]) == pytest.approx(float(expected), rel=1e-5)
    assert not normed[0][1]._forward_hooks  # the caller's models carry no hooks


def test_flat_inputs_are_drawn_as_squares() -> None:
    assert image_shape((64,)) == (1, 8, 8)
    assert image_shape((3, 32, 32)) == (3, 32, 32)
    assert image_shape((10,)) == (1, 1, 10)
