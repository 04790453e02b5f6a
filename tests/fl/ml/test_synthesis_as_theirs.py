"""The data-free synthesis as FedRevive's code does it, checked against values computed by hand:
per-teacher weighted terms, the spike guard, the Reptile step through Adam with eps 0, fresh
embeddings, the output range, per-image reflect crops, the adversarial gate, estimated class
proportions, and the teachers asked in one vmapped call."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fedqueue.errors import ConfigError
from fedqueue.fl.config import RunConfig
from fedqueue.fl.ml.loss_window import LossWindow
from fedqueue.fl.ml.models import build_model
from fedqueue.fl.ml.proportion_proxy import ProportionProxy
from fedqueue.fl.ml.synthesis import SynthesisSettings, Synthesizer, weighted_terms
from fedqueue.fl.ml.teacher_stack import TeacherStack
from fedqueue.fl.strategy.fedrevive.section import FedReviveSection

SMALL = SynthesisSettings(nz=8, ngf=8, synth_batch_size=8, g_steps=2, warmup_rounds=3, pool_size=40)


def test_the_spike_guard_lets_through_what_their_window_lets_through() -> None:
    window = LossWindow()
    assert float(window.guard(torch.tensor(float("nan")))) == 0.0  # not finite: zero, not remembered
    for value in [1.0] * 9:
        assert float(window.guard(torch.tensor(value))) == value
    assert float(window.guard(torch.tensor(50.0))) == 50.0  # 9 remembered: too few to call a spike
    # Now 10 remembered, mean (9 + 50) / 10 = 5.9: above 3 x 5.9 is a spike.
    assert float(window.guard(torch.tensor(17.0))) == 17.0
    assert float(window.guard(torch.tensor(3 * (9 + 50 + 17) / 11 + 0.01))) == 0.0
    for _ in range(20):  # the window keeps the last 20: the 50 and 17 roll out
        window.guard(torch.tensor(2.0))
    assert int(window.count) == 20 and float(window.values.mean()) == 2.0
    assert float(window.guard(torch.tensor(6.5))) == 0.0 and float(window.guard(torch.tensor(5.5))) == 5.5
    restored = LossWindow()
    restored.load(window.state())
    assert torch.equal(restored.values, window.values) and int(restored.count) == 20


def test_each_term_weighs_each_teacher_by_its_share_of_the_label() -> None:
    torch.manual_seed(0)
    logits = torch.randn(2, 3, 4)  # 2 teachers, 3 samples, 4 classes
    labels = torch.tensor([0, 1, 3])
    q = torch.tensor([[0.5, 0.5, 0.0, 0.0], [0.5, 0.0, 0.0, 1.0]])
    shares = q / q.sum(dim=0, keepdim=True).clamp_min(1e-8)
    weights = shares[:, labels].T  # sample 0: 1/2 each; sample 1: teacher 0 only; sample 2: teacher 1 only
    distances = torch.tensor([2.0, 4.0])
    student = torch.randn(3, 4)
    bn, oh, adv = weighted_terms(logits, distances, labels, weights, student)
    assert float(bn) == pytest.approx((2.0 * 1.5 + 4.0 * 1.5) / 3)
    ce = [[float(F.cross_entropy(logits[k, i : i + 1], labels[i : i + 1])) for i in range(3)] for k in range(2)]
    assert float(oh) == pytest.approx((0.5 * ce[0][0] + 0.5 * ce[1][0] + ce[0][1] + ce[1][2]) / 3, rel=1e-6)
    expected = 0.0
    for k in range(2):
        for i in range(3):
            p = F.softmax(logits[k, i], dim=0)
            kl = float((p * (p.log() - F.log_softmax(student[i], dim=0))).sum())
            agree = int(student[i].argmax() == logits[k, i].argmax())
            expected += float(weights[i, k]) * -(kl * agree)
    assert float(adv) == pytest.approx(expected / 3, rel=1e-5, abs=1e-7)
    assert float(weighted_terms(logits, distances, labels, weights, None)[2]) == 0.0


def teachers(count: int, seed: int = 0) -> list[nn.Module]:
    torch.manual_seed(seed)
    return [build_model("cnn", (3, 8, 8), 4) for _ in range(count)]


def test_the_reptile_step_moves_every_weight_by_lr_g_first_and_no_embedding_is_kept() -> None:
    torch.manual_seed(0)
    synth = Synthesizer(SMALL, (3, 8, 8), 4)
    before = [p.detach().clone() for p in synth.generator.parameters()]
    synth.synthesize(TeacherStack(teachers(2)), torch.full((2, 4), 0.25), teachers(1, 5)[0], 0)
    for old, new in zip(before, synth.generator.parameters(), strict=True):
        moved = (new.detach() - old).abs()
        # Adam with eps 0: a first step of exactly lr_g wherever the copy moved at all.
        assert torch.allclose(moved[moved > 0], torch.full_like(moved[moved > 0], SMALL.lr_g), rtol=1e-4)
    assert not any("embed" in name for name in synth.state_dict())  # class embeddings are drawn per call


def test_images_stay_in_the_data_s_range_and_the_pool_keeps_16000_by_default() -> None:
    assert SynthesisSettings().pool_size == 16_000
    low, high = torch.tensor([-2.0, -1.0, 0.0]), torch.tensor([2.0, 1.0, 0.5])
    torch.manual_seed(0)
    synth = Synthesizer(SMALL, (3, 8, 8), 4, pixel_range=(low, high))
    synth.synthesize(TeacherStack(teachers(2)), torch.full((2, 4), 0.25), teachers(1, 5)[0], 0)
    images = synth.pool()[0]
    per_channel = images.transpose(0, 1).reshape(3, -1)
    assert bool((per_channel.min(dim=1).values >= low).all()) and bool((per_channel.max(dim=1).values <= high).all())


def test_each_image_gets_its_own_reflect_padded_crop() -> None:
    synth = Synthesizer(SMALL, (3, 32, 32), 4)
    image = torch.arange(32.0).repeat(3, 32, 1)  # column index as the value
    torch.manual_seed(0)
    out = synth.augment_images(image.expand(16, 3, 32, 32).clone())
    padded = F.pad(image.unsqueeze(0), (4, 4, 4, 4), mode="reflect")[0]
    crops = {(top, left): padded[:, top : top + 32, left : left + 32] for top in range(9) for left in range(9)}
    shifts = set()
    for one in out:
        found = [key for key, crop in crops.items() if torch.equal(one, crop) or torch.equal(one, crop.flip(-1))]
        assert found, "not a crop of the reflect-padded image"
        shifts.add(found[0][1])
    assert len(shifts) > 1  # shifts drawn per image, not once per batch


def test_the_adversarial_gate_counts_calls_or_versions() -> None:
    by_calls = Synthesizer(SMALL, (3, 8, 8), 4)
    by_version = Synthesizer(SynthesisSettings(**{**SMALL.__dict__, "adv_gate": "version"}), (3, 8, 8), 4)
    by_calls.calls = by_version.calls = 2
    assert not by_calls.adversarial(current_round=500) and by_version.adversarial(current_round=3)
    by_calls.calls = 3
    assert by_calls.adversarial(current_round=0) and not by_version.adversarial(current_round=2)


def test_estimated_proportions_average_the_first_two_uploads_then_freeze() -> None:
    proxy = ProportionProxy((3, 8, 8), 4, seed=7, probes=16)
    first, second, third = teachers(3, 1)
    for model in (first, second, third):
        proxy.observe(device=5, model=model)
    probes = torch.randn((16, 3, 8, 8), generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        each = [F.softmax(m(probes) / 0.8, dim=1).mean(dim=0).double() for m in (first, second)]
    assert np.allclose(proxy.of(5), ((each[0] + each[1]) / 2).numpy())  # the third upload changed nothing
    assert np.allclose(proxy.of(6), np.full(4, 0.25)) and not proxy.wants(5) and proxy.wants(6)
    restored = ProportionProxy((3, 8, 8), 4, seed=7, probes=16)
    restored.load_state_dict(proxy.state_dict())
    assert np.array_equal(restored.of(5), proxy.of(5)) and not restored.wants(5)


@pytest.mark.parametrize("model", ["cnn", "resnet18_fedrevive", "resnet18"])
def test_the_vmapped_teachers_answer_as_each_teacher_alone(model: str) -> None:
    torch.manual_seed(0)
    group = [build_model(model, (3, 32, 32), 10).eval() for _ in range(3)]
    for teacher in group:  # each its own statistics
        for buffer in teacher.buffers():
            if buffer.is_floating_point():
                buffer.add_(torch.rand_like(buffer))
    x = torch.randn(4, 3, 32, 32)
    logits, _ = TeacherStack(group).ask(x)
    for k, teacher in enumerate(group):
        assert torch.allclose(logits[k], teacher(x), atol=1e-5)
    each = torch.randn(3, 2, 3, 32, 32)
    assert torch.allclose(TeacherStack(group).ask_each(each)[2], group[2](each[2]), atol=1e-5)


def test_the_dfkd_table_takes_the_new_knobs_and_names_a_bad_one() -> None:
    base = {"mode": "fedrevive", "kd_augmentation": "dfkd", "buffer_size": 1, "concurrency": 4}
    config = RunConfig.from_dict(
        {**base, "dfkd": {"class_proportion_source": "estimated", "synthesis_interval": 10, "adv_gate": "version"}}
    )
    assert config.strategy(FedReviveSection).dfkd["synthesis_interval"] == 10
    for bad, field in (
        ({"class_proportion_source": "guessed"}, "dfkd.class_proportion_source"),
        ({"adv_gate": 3}, "dfkd.adv_gate"),
        ({"synthesis_interval": 0}, "dfkd.synthesis_interval"),
    ):
        with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
            RunConfig.from_dict({**base, "dfkd": bad})


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_a_gpu_the_synthesis_makes_what_it_makes_on_the_cpu() -> None:
    """Every draw is made on the CPU, so a GPU worker's pool differs from a CPU worker's by rounding only."""
    pools = {}
    for device in ("cpu", "cuda"):
        group = [model.to(device) for model in teachers(3)]
        student = teachers(1, 5)[0].to(device)
        torch.manual_seed(0)
        synth = Synthesizer(SMALL, (3, 8, 8), 4)
        torch.manual_seed(1)
        parts = synth.synthesize(TeacherStack(group), torch.full((3, 4), 0.25), student, 5)
        assert parts["loss"].device.type == device
        pools[device] = synth.pool()
    assert torch.equal(pools["cpu"][1], pools["cuda"][1])
    assert torch.allclose(pools["cpu"][0], pools["cuda"][0], atol=1e-3)
