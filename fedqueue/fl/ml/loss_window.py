"""FedRevive's guard against loss spikes, kept on the loss's device so a training step never waits on the host.

A loss is let through when it is finite and, once at least 10 are remembered, at most 3 times the mean
of the last (up to) 20 let through; otherwise it is replaced by zero, so that step changes nothing.
Only losses let through are remembered. Each loss term of the server's synthesis, and its
distillation's loss, has a window of its own that lives as long as the synthesizer.
"""

from __future__ import annotations

import torch
from torch import Tensor

SIZE = 20  # losses remembered
MIN_SEEN = 10  # before any loss can be called a spike
SPIKE = 3.0  # times the remembered mean


class LossWindow:
    """The last losses let through, newest last; `count` of the `SIZE` slots hold one."""

    def __init__(self) -> None:
        self.values = torch.zeros(SIZE, dtype=torch.float64)
        self.count = torch.zeros((), dtype=torch.int64)

    def guard(self, loss: Tensor) -> Tensor:
        """The loss, or a zero in its place when it is not finite or a spike; remembers what it lets through."""
        values, count = self.values.to(loss.device), self.count.to(loss.device)
        value = loss.detach().to(torch.float64)
        held = torch.arange(SIZE, device=loss.device) >= SIZE - count
        mean = (values * held).sum() / count.clamp_min(1)
        spike = (count >= MIN_SEEN) & (value > SPIKE * mean) & (mean > 0)
        keep = torch.isfinite(value) & ~spike
        self.values = torch.where(keep, torch.cat([values[1:], value.view(1)]), values)
        self.count = torch.where(keep, (count + 1).clamp_max(SIZE), count)
        return torch.where(keep, loss, torch.zeros_like(loss))

    def state(self) -> Tensor:
        """The count, then the values, as one CPU tensor."""
        return torch.cat([self.count.to(torch.float64).view(1).cpu(), self.values.cpu()])

    def load(self, state: Tensor) -> None:
        self.count = state[0].to(torch.int64).clone()
        self.values = state[1:].to(torch.float64).clone()
