"""Pay torch's one-time start-up costs before the first task, not inside it."""

from __future__ import annotations

import torch
from torch import nn


def warm_up() -> None:
    """One tiny forward/backward/step: torch initialises its kernels and thread pools once."""
    import sklearn.datasets  # noqa: F401  imported here: the digits loader needs it at the first task

    generator = torch.Generator().manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 2, 3), nn.Flatten(), nn.Linear(72, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.5)
    inputs = torch.rand(4, 1, 8, 8, generator=generator)
    loss = nn.functional.cross_entropy(model(inputs), torch.tensor([0, 1, 0, 1]))
    loss.backward()
    optimizer.step()
