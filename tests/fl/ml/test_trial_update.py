"""The pack-mode trial's stand-in optimizer: the same steps as torch.optim, without importing its machinery."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch

from fedqueue.fl.ml.train import LocalTrainConfig, make_optimizer
from fedqueue.fl.ml.trial_update import TrialUpdate


@pytest.mark.parametrize(("optimizer", "momentum"), [("sgd", 0.0), ("sgd", 0.9), ("adam", 0.0)])
def test_the_trial_update_steps_as_torch_optim_does(optimizer: str, momentum: float) -> None:
    cfg = LocalTrainConfig(
        local_iters=5, local_epochs=None, batch_size=4, optimizer=optimizer, lr=0.05, momentum=momentum
    )
    torch.manual_seed(3)
    start = [torch.randn(6, 3), torch.randn(3)]
    gradients = [[torch.randn_like(tensor) for tensor in start] for _ in range(5)]
    ends = []
    for make in (make_optimizer, TrialUpdate):
        parameters = [tensor.clone().requires_grad_() for tensor in start]
        stepper = make(parameters, cfg)
        for step in gradients:
            stepper.zero_grad(set_to_none=True)
            for parameter, gradient in zip(parameters, step, strict=True):
                parameter.grad = gradient.clone()
            stepper.step()
        ends.append([parameter.detach() for parameter in parameters])
    for expected, got in zip(*ends, strict=True):
        torch.testing.assert_close(got, expected)
    assert not torch.equal(ends[1][0], start[0])


def test_timing_the_pack_modes_at_submit_leaves_torch_optim_unloaded() -> None:
    """torch.optim's first optimizer imports torch._dynamo (about a second); the submit's trial must not."""
    script = textwrap.dedent(
        """
        import sys
        from fedqueue.fl.config import RunConfig
        from fedqueue.fl.ml.data import load_federated
        from fedqueue.fl.packs.trial import time_pack_modes
        from fedqueue.fl.setup import data_spec
        config = RunConfig.from_dict({"dataset": "digits", "model": "mlp", "num_devices": 20, "devices_per_round": 10})
        sequential, vmapped = time_pack_modes(config, load_federated(data_spec(config)), 4)
        assert sequential > 0 and vmapped > 0
        print("torch._dynamo" in sys.modules)
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True)
    assert done.stdout.strip() == "False"
