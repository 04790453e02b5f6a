"""FedRevive's server-side treatment of stale updates: distil recent local models into the current
global model, and mix the result into each update by a staleness-dependent beta. Pure: no I/O.

For an update of staleness s that arrives while version v is current:

    teachers = the local models of the last `kd_buffer_size` folded updates, this one included
    student  = version v, trained `kd_iters` Adam steps to match the teachers on the server's
               held-out data (softened by `kd_temperature`; loss KL x T^2)
    kd_delta = student - version v
    delta'   = (1 - beta(s)) x (local - base) + beta(s) x kd_delta

and a version is made from the mixed deltas as FedBuff makes it from plain ones. The server's
data is either a `kd_split` of the training data that no device holds (`kd_augmentation =
"simple_kd"`, FedRevive's data-dependent variant), or, with no data at all, the pool of images
its data-free synthesizer makes from the teachers (`"dfkd"`, fl/ml/synthesis.py).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fedqueue.fl.ml.synthesis import SynthesisSettings

KD_AUGMENTATIONS = ("simple_kd", "dfkd")  # distil on held-out samples, or on synthesised ones
KD_VERSIONS = ("distribution_match_batch", "avg_logits", "avg_loss")
BETA_SCHEDULES = ("cosine", "exponential", "linear", "stepwise")
KD_STREAM = 0xFD4E  # keeps the distillation batches apart from every other use of the run's seed


def dfkd_defaults() -> dict[str, int | float]:
    """The knobs of the `dfkd` table and their defaults: the synthesizer's, and freeze_rounds (versions
    made before any update is revived: until then updates go in as they came)."""
    return {"freeze_rounds": 50, **asdict(SynthesisSettings())}


def kd_beta(rule: float | str, factor: float, staleness: int, concurrency: int, buffer_size: int) -> float:
    """How much of an update of this staleness is replaced by the distilled one, in [0, 1].

    A number is a constant beta. The schedules rise with staleness, `factor` setting their scale:
    - cosine: (1 - cos(pi s / (2 factor))) / 2 up to s = 2 factor, then 1 (FedRevive's default, factor 75);
    - exponential: 1 - exp(-factor s);
    - linear: min(1, factor s);
    - stepwise: 0, 0.25, 0.5, 0.75, 1 at quarters of factor x concurrency / buffer_size.
    """
    if not isinstance(rule, str):
        return float(rule)
    if rule == "cosine":
        beta = 1.0 if staleness > 2 * factor else 1.0 - 0.5 * (1.0 + math.cos(math.pi * staleness / (2.0 * factor)))
    elif rule == "exponential":
        beta = 1.0 - math.exp(-factor * staleness)
    elif rule == "linear":
        beta = factor * staleness
    elif rule == "stepwise":
        base = factor * concurrency / buffer_size
        beta = 0.25 * sum(staleness >= base * quarter / 4 for quarter in (1, 2, 3, 4))
    else:
        raise ValueError(f"unknown beta schedule {rule!r} (choose a number or one of {', '.join(BETA_SCHEDULES)})")
    return min(1.0, max(0.0, beta))


class KdData:
    """The server's held-out samples, and batches drawn from them for distillation."""

    def __init__(self, x: Tensor, y: Tensor, num_classes: int) -> None:
        self.x, self.y = x, y
        labels = y.numpy()
        self.by_class = [np.flatnonzero(labels == label) for label in range(num_classes)]

    def uniform(self, rng: np.random.Generator, size: int) -> Tensor:
        return torch.from_numpy(rng.integers(0, len(self.y), size=size))

    def matching(self, rng: np.random.Generator, size: int, proportions: np.ndarray) -> Tensor:
        """A batch whose labels follow a device's class proportions (classes the split lacks are skipped)."""
        present = np.array([len(indices) > 0 for indices in self.by_class])
        weights = np.where(present, proportions, 0.0)
        weights = weights / weights.sum() if weights.sum() > 0 else present / present.sum()
        classes = rng.choice(len(weights), size=size, p=weights)
        picks = [self.by_class[label][rng.integers(len(self.by_class[label]))] for label in classes]
        return torch.as_tensor(np.asarray(picks, dtype=np.int64))


def _kl(student_logits: Tensor, teacher_logits: Tensor, temperature: float) -> Tensor:
    soft_student = F.log_softmax(student_logits / temperature, dim=1)
    soft_teacher = F.softmax(teacher_logits / temperature, dim=1)
    return F.kl_div(soft_student, soft_teacher, reduction="batchmean") * temperature**2


def distil(
    student: nn.Module,
    teachers: Sequence[nn.Module],
    teacher_proportions: Sequence[np.ndarray],
    data: KdData,
    rng: np.random.Generator,
    *,
    iters: int,
    lr: float,
    batch_size: int,
    temperature: float,
    version: str,
    augment: Callable[[Tensor], Tensor] | None = None,
) -> None:
    """Train `student` in place to match the teachers' softened outputs on the server's data
    (each batch passed through `augment` first, as the data-free variant does with its images)."""

    def draw(index: Tensor) -> Tensor:
        inputs = data.x.index_select(0, index)
        if augment is not None:
            with torch.no_grad():
                inputs = augment(inputs)
        return inputs

    for teacher in teachers:
        teacher.eval()
    student.train()
    optimizer = torch.optim.Adam(student.parameters(), lr=lr)
    for _ in range(iters):
        optimizer.zero_grad()
        if version == "distribution_match_batch":
            # Each teacher is asked on a batch drawn like its own device's labels.
            losses = []
            for teacher, proportions in zip(teachers, teacher_proportions, strict=True):
                inputs = draw(data.matching(rng, batch_size, proportions))
                with torch.no_grad():
                    target = teacher(inputs)
                losses.append(_kl(student(inputs), target, temperature))
            loss = torch.stack(losses).mean()
        else:
            inputs = draw(data.uniform(rng, batch_size))
            with torch.no_grad():
                targets = [teacher(inputs) for teacher in teachers]
            logits = student(inputs)
            if version == "avg_logits":
                loss = _kl(logits, torch.stack(targets).mean(dim=0), temperature)
            else:
                loss = torch.stack([_kl(logits, target, temperature) for target in targets]).mean()
        loss.backward()
        optimizer.step()


def mixed_delta(
    base: Mapping[str, Tensor], local: Mapping[str, Tensor], kd_delta: Mapping[str, Tensor] | None, beta: float
) -> dict[str, Tensor]:
    """(1 - beta) x (local - base) + beta x kd_delta, in float64, for the floating tensors."""
    mixed = {}
    for name, start in base.items():
        if not start.is_floating_point():
            continue
        delta = local[name].detach().to(torch.float64) - start.detach().to(torch.float64)
        if kd_delta is not None and beta > 0:
            delta = (1.0 - beta) * delta + beta * kd_delta[name].detach().to(torch.float64)
        mixed[name] = delta
    return mixed


def class_proportions(labels: np.ndarray, num_classes: int) -> np.ndarray:
    counts = np.bincount(labels, minlength=num_classes).astype(float)
    return counts / counts.sum() if counts.sum() > 0 else np.full(num_classes, 1.0 / num_classes)
