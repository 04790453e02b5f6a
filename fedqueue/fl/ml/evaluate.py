"""Accuracy and loss of a model on held-out data, overall and per class."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from fedqueue.errors import DataError
from fedqueue.fl.ml.plugins import TensorData


@dataclass(frozen=True)
class Evaluation:
    """Overall accuracy in [0, 1] and mean cross-entropy, and the same per class (FedRevive's `label_wise`
    metrics; None for a class the data lacks)."""

    accuracy: float
    loss: float
    class_accuracy: list[float | None]
    class_loss: list[float | None]

    def label_wise(self) -> dict[str, list[float | None]]:
        """As stored with a version (JSON: no NaN)."""
        return {"accuracy": list(self.class_accuracy), "loss": list(self.class_loss)}


def evaluate(model: nn.Module, data: TensorData, device: torch.device, batch_size: int = 1024) -> tuple[float, float]:
    """(accuracy in [0, 1], mean cross-entropy) over all of data."""
    result = evaluate_by_class(model, data, device, 0, batch_size)
    return result.accuracy, result.loss


def evaluate_by_class(
    model: nn.Module, data: TensorData, device: torch.device, num_classes: int, batch_size: int = 1024
) -> Evaluation:
    """Overall and per-class accuracy and loss over all of data (classes 0..num_classes-1)."""
    count = len(data)
    if count == 0:
        raise DataError("evaluate: no samples to evaluate on")
    model.to(device)
    model.eval()
    correct = torch.zeros((), dtype=torch.int64, device=device)
    loss_sum = torch.zeros((), dtype=torch.float64, device=device)
    # Per class, beside the overall sums (which stay summed as they always were).
    class_correct = torch.zeros(num_classes, dtype=torch.int64, device=device)
    class_loss = torch.zeros(num_classes, dtype=torch.float64, device=device)
    with torch.no_grad():
        for start in range(0, count, batch_size):
            x = data.x[start : start + batch_size].to(device)
            y = data.y[start : start + batch_size].to(device)
            logits = model(x)
            hits = logits.argmax(dim=1) == y
            loss_sum += F.cross_entropy(logits, y, reduction="sum")
            correct += hits.sum()
            if num_classes:
                losses = F.cross_entropy(logits, y, reduction="none")
                class_loss.index_add_(0, y, losses.to(torch.float64))
                class_correct.index_add_(0, y, hits.to(torch.int64))
    sizes = torch.bincount(data.y, minlength=num_classes)[:num_classes].tolist() if num_classes else []
    hits_per_class, losses_per_class = class_correct.tolist(), class_loss.tolist()
    return Evaluation(
        accuracy=int(correct.item()) / count,
        loss=float(loss_sum.item()) / count,
        class_accuracy=[hits / n if n else None for hits, n in zip(hits_per_class, sizes, strict=True)],
        class_loss=[total / n if n else None for total, n in zip(losses_per_class, sizes, strict=True)],
    )
