"""FedProx (Li et al., 2020) as a fedqueue local step.

Each device minimises its loss plus (mu / 2) * ||w - w_global||^2, which keeps
local models near the global one when devices' data differ. With mu = 0 it is
FedAvg's local objective exactly.

    local_step = "fedqueue_examples.fedprox:fedprox_step"
    [plugin]
    mu = 0.01
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


def validate_options(options: dict[str, Any]) -> None:
    """fedqueue calls this at submit time: a bad `mu` is refused before anything is enqueued."""
    mu = options.get("mu", 0.0)
    if isinstance(mu, bool) or not isinstance(mu, (int, float)) or mu < 0:
        raise ValueError(f"mu must be a number >= 0, got {mu!r}")


def fedprox_step(
    model: nn.Module,
    batch: tuple[torch.Tensor, torch.Tensor],
    global_state: Mapping[str, torch.Tensor],
    options: Mapping[str, Any],
) -> torch.Tensor:
    inputs, labels = batch
    loss = F.cross_entropy(model(inputs), labels)
    mu = float(options.get("mu", 0.0))
    proximal = sum((parameter - global_state[name]).pow(2).sum() for name, parameter in model.named_parameters())
    return loss + (mu / 2) * proximal


fedprox_step.validate_options = validate_options  # type: ignore[attr-defined]
