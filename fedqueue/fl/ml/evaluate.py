"""Accuracy and loss of a model on held-out data."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from fedqueue.errors import DataError
from fedqueue.fl.ml.plugins import TensorData


def evaluate(model: nn.Module, data: TensorData, device: torch.device, batch_size: int = 1024) -> tuple[float, float]:
    """(accuracy in [0, 1], mean cross-entropy) over all of data."""
    count = len(data)
    if count == 0:
        raise DataError("evaluate: no samples to evaluate on")
    model.to(device)
    model.eval()
    correct = torch.zeros((), dtype=torch.int64, device=device)
    loss_sum = torch.zeros((), dtype=torch.float64, device=device)
    with torch.no_grad():
        for start in range(0, count, batch_size):
            x = data.x[start : start + batch_size].to(device)
            y = data.y[start : start + batch_size].to(device)
            logits = model(x)
            loss_sum += F.cross_entropy(logits, y, reduction="sum")
            correct += (logits.argmax(dim=1) == y).sum()
    return int(correct.item()) / count, float(loss_sum.item()) / count
