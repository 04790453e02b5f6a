"""model = "resnet18_fedrevive": FedRevive's ResNet-18 with StatTrackers in place of BatchNorm."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedqueue.errors import ConfigError
from fedqueue.fl.ml.models import build_model, initial_state
from fedqueue.fl.ml.pack_train import vmap_refusal
from fedqueue.fl.ml.stat_resnet import StatTracker, reset_trackers
from fedqueue.fl.ml.synthesis import SynthesisSettings, Synthesizer
from fedqueue.fl.ml.teacher_stack import TeacherStack


def model(classes: int = 10) -> torch.nn.Module:
    torch.manual_seed(0)
    return build_model("resnet18_fedrevive", (3, 32, 32), classes)


def test_parameter_and_tracker_counts() -> None:
    net = model()
    convs = 3 * 64 * 9 + 4 * 64 * 64 * 9  # stem, layer1
    for inputs, outputs in ((64, 128), (128, 256), (256, 512)):  # layers 2-4: 3 + 3 x 3 convs and a 1x1 shortcut
        convs += inputs * outputs * 9 + 3 * outputs * outputs * 9 + inputs * outputs
    assert sum(p.numel() for p in net.parameters()) == convs + 512 * 10 == 11_164_352  # linear without bias
    trackers = [name for name, module in net.named_modules() if isinstance(module, StatTracker)]
    assert len(trackers) == 20 and "layer2.0.shortcut.stat_track" in trackers
    assert not any(isinstance(m, torch.nn.modules.batchnorm._BatchNorm) for m in net.modules())
    assert "layer2.0.shortcut.conv.weight" in net.state_dict()
    with pytest.raises(ConfigError, match="^model:"):
        build_model("resnet18_fedrevive", (3, 28, 28), 10)


def test_trackers_record_in_train_mode_and_pass_inputs_through() -> None:
    tracker = StatTracker(3)
    x = torch.randn(4, 3, 5, 5) * 2 + 1
    assert torch.equal(tracker(x), x)
    mean, var = x.mean(dim=(0, 2, 3)), x.var(dim=(0, 2, 3), unbiased=False)
    torch.testing.assert_close(tracker.running_mean, 0.1 * mean)
    torch.testing.assert_close(tracker.running_var, 0.9 + 0.1 * var)
    tracker.eval()
    before = tracker.running_mean.clone()
    assert torch.equal(tracker(x), x) and torch.equal(tracker.running_mean, before)


def test_eval_and_train_give_the_same_logits_and_reset_restores_0_and_1() -> None:
    net = model()
    x = torch.randn(2, 3, 32, 32)
    net.train()
    trained = net(x)
    net.eval()
    torch.testing.assert_close(net(x), trained)
    state = net.state_dict()
    assert any(not torch.equal(v, torch.zeros_like(v)) for k, v in state.items() if k.endswith("running_mean"))
    reset = reset_trackers(state)
    fresh = initial_state("resnet18_fedrevive", (3, 32, 32), 10, 0)
    for key, value in reset.items():
        if "stat_track" in key:
            assert torch.equal(value, fresh[key])
        else:
            assert value is state[key]
    plain = {"0.weight": torch.ones(2), "0.running_mean": torch.ones(2)}  # no trackers: unchanged
    assert reset_trackers(plain) == plain


def test_vmap_refuses_it_in_one_line() -> None:
    refusal = vmap_refusal(model())
    assert refusal is not None and "StatTracker" in refusal and "\n" not in refusal


def test_synthesis_reads_the_trackers_and_runs_one_step() -> None:
    teacher = model()
    teacher.train()
    teacher(torch.randn(8, 3, 32, 32))  # a device's statistics
    stack = TeacherStack([teacher])
    assert len(stack._shell.layers) == 20
    settings = SynthesisSettings(nz=8, ngf=8, synth_batch_size=4, g_steps=1, warmup_rounds=0, pool_size=8)
    torch.manual_seed(1)
    synth = Synthesizer(settings, (3, 32, 32), 10)
    parts = synth.synthesize(stack, torch.full((1, 10), 0.1), model(), current_round=1)
    assert float(parts["bn"]) > 0 and np.isfinite(float(parts["loss"]))
    assert synth.pool()[0].shape == (4, 3, 32, 32)
