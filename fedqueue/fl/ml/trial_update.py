"""The pack-mode trial's optimizer: torch.optim's update, element by element, without torch.optim.

A process's first torch.optim optimizer imports torch._dynamo, about a second of CPU. The
submit that times one pack both ways (fedqueue.fl.setup) would pay it before the first
round is sent, for a choice that only compares the two ways. This update does the same work per
element as SGD (with momentum) or Adam, one parameter at a time as torch.optim does on a CPU,
so the trial keeps the optimizer's share of a step in both ways. Nothing trained with it is kept.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from fedqueue.fl.ml.train import LocalTrainConfig

ADAM_BETAS = (0.9, 0.999)
ADAM_EPS = 1e-8


class TrialUpdate:
    """SGD (momentum) or Adam's update, in place; its per-parameter buffers live in `state`."""

    def __init__(self, parameters: Iterable[torch.Tensor], cfg: LocalTrainConfig) -> None:
        self.parameters = list(parameters)
        self.cfg = cfg
        self.state: dict[torch.Tensor, dict[str, torch.Tensor]] = {}
        self.steps = 0

    def zero_grad(self, set_to_none: bool = True) -> None:
        for parameter in self.parameters:
            parameter.grad = None

    @torch.no_grad()
    def step(self) -> None:
        self.steps += 1
        for parameter in self.parameters:
            if parameter.grad is not None:
                self._update(parameter, parameter.grad)

    def _update(self, parameter: torch.Tensor, grad: torch.Tensor) -> None:
        cfg = self.cfg
        if cfg.optimizer == "sgd":
            if cfg.momentum:
                buffers = self.state.setdefault(parameter, {"momentum_buffer": torch.zeros_like(parameter)})
                grad = buffers["momentum_buffer"].mul_(cfg.momentum).add_(grad)
            parameter.add_(grad, alpha=-cfg.lr)
            return
        beta1, beta2 = ADAM_BETAS
        buffers = self.state.setdefault(
            parameter, {"exp_avg": torch.zeros_like(parameter), "exp_avg_sq": torch.zeros_like(parameter)}
        )
        buffers["exp_avg"].lerp_(grad, 1 - beta1)
        buffers["exp_avg_sq"].mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
        corrected = 1 - beta1**self.steps
        denominator = (buffers["exp_avg_sq"].sqrt() / (1 - beta2**self.steps) ** 0.5).add_(ADAM_EPS)
        parameter.addcdiv_(buffers["exp_avg"], denominator, value=-cfg.lr / corrected)
