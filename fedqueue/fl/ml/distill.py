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
from dataclasses import asdict, dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fedqueue.fl.ml.loss_window import LossWindow
from fedqueue.fl.ml.synthesis import SynthesisSettings
from fedqueue.fl.ml.teacher_stack import TeacherStack
from fedqueue.fl.ml.torch_device import host_to_device

KD_AUGMENTATIONS = ("simple_kd", "dfkd")  # distil on held-out samples, or on synthesised ones
KD_VERSIONS = ("distribution_match_batch", "avg_logits", "avg_loss")
BETA_SCHEDULES = ("cosine", "exponential", "linear", "stepwise")
KD_STREAM = 0xFD4E  # keeps the distillation batches apart from every other use of the run's seed


PROPORTION_SOURCES = ("labels", "estimated")  # the devices' true label shares, or PR #5274's estimate


@dataclass(frozen=True)
class ReviveSettings:
    """The `dfkd` table's knobs of the server step itself; the synthesizer's are SynthesisSettings."""

    freeze_rounds: int = 50
    """Versions made before any update is revived; until then updates go in as they came (`freeze_rounds`)."""
    synthesis_interval: int = 1
    """The generator trains only at arrivals whose current version is a multiple of it; the student still distils
    on every revived update, from the pool as it stands (PR #5274's `generation_interval`)."""
    student_weight_decay: float = 1e-5
    """The distilled student's Adam weight decay."""
    class_proportion_source: str = "labels"
    """The teachers' class shares: their devices' true label histograms (`labels`, their simulator), or
    `estimated` from each device's first uploads (PR #5274's `--class-proportion-source estimated`)."""
    proxy_uploads: int = 2
    """With `estimated` shares: a device's first uploads the estimate averages over, frozen after them
    (fl/ml/proportion_proxy.py)."""
    proxy_temperature: float = 0.8
    """With `estimated` shares: the temperature of the softmax averaged over the probes."""
    proxy_probes: int = 64
    """With `estimated` shares: the noise probes every upload is shown, drawn once from the run's seed."""


def dfkd_defaults() -> dict[str, int | float | str]:
    """The knobs of the `dfkd` table and their defaults: the server step's own (ReviveSettings), then the
    synthesizer's (SynthesisSettings)."""
    return {**asdict(ReviveSettings()), **asdict(SynthesisSettings())}


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
    """The server's held-out samples (or the synthesizer's pool), and batches drawn from them for distillation."""

    def __init__(self, x: Tensor, y: Tensor, num_classes: int) -> None:
        self.x, self.y = x, y
        labels = y.numpy()
        # The samples sorted by label: class c's are order[starts[c] : starts[c] + counts[c]].
        self.order = np.argsort(labels, kind="stable")
        self.counts = np.bincount(labels, minlength=num_classes)
        self.starts = np.concatenate([[0], np.cumsum(self.counts)[:-1]])

    def uniform(self, rng: np.random.Generator, size: int) -> Tensor:
        return torch.from_numpy(rng.integers(0, len(self.y), size=size))

    def matching(self, rng: np.random.Generator, size: int, proportions: np.ndarray) -> Tensor:
        """A batch whose labels follow a device's class proportions, each sample drawn uniformly (with
        replacement) within its class; classes the data lacks are skipped."""
        present = self.counts > 0
        weights = np.where(present, proportions, 0.0)
        weights = weights / weights.sum() if weights.sum() > 0 else present / present.sum()
        classes = rng.choice(len(weights), size=size, p=weights)
        offsets = (rng.random(size) * self.counts[classes]).astype(np.int64)
        return torch.from_numpy(self.order[self.starts[classes] + offsets])


def _kl_sum(student_logits: Tensor, teacher_logits: Tensor, temperature: float) -> Tensor:
    """KL(teacher || student) at this temperature, summed over the batch, times T^2."""
    soft_student = F.log_softmax(student_logits / temperature, dim=-1)
    soft_teacher = F.softmax(teacher_logits / temperature, dim=-1)
    return F.kl_div(soft_student, soft_teacher, reduction="sum") * temperature**2


def has_batch_norm(model: nn.Module) -> bool:
    """Whether a training forward pass depends on how the batch is split (BatchNorm's batch statistics)."""
    return any(isinstance(layer, nn.modules.batchnorm._BatchNorm) for layer in model.modules())


def distil(
    student: nn.Module,
    teachers: TeacherStack,
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
    weight_decay: float = 0.0,
    guard: LossWindow | None = None,
) -> None:
    """Train `student` in place to match the teachers' softened outputs on the server's data (each batch
    passed through `augment` first, as the data-free variant does with its images). The loss is the
    KL x T^2 summed over the teachers' batches, divided by their samples; `guard` zeroes spikes.

    All teachers are asked in one vmapped call; the student sees every teacher's batch in one forward
    pass too, unless it has BatchNorm (whose statistics depend on the batch it is given)."""
    device = next(student.parameters()).device
    count = teachers.count
    split = has_batch_norm(student)

    def draw(index: Tensor) -> Tensor:
        inputs = host_to_device(data.x.index_select(0, index), device)
        if augment is not None:
            with torch.no_grad():
                inputs = augment(inputs)
        return inputs

    student.train()
    optimizer = torch.optim.Adam(student.parameters(), lr=lr, weight_decay=weight_decay)
    for _ in range(iters):
        optimizer.zero_grad()
        if version == "distribution_match_batch":
            # Each teacher is asked on a batch drawn like its own device's labels.
            index = torch.cat([data.matching(rng, batch_size, proportions) for proportions in teacher_proportions])
            inputs = draw(index).view(count, batch_size, *data.x.shape[1:])
            with torch.no_grad():
                targets = teachers.ask_each(inputs)
            if split:
                logits = torch.stack([student(batch) for batch in inputs])
            else:
                logits = student(inputs.flatten(0, 1)).view(count, batch_size, -1)
            loss = _kl_sum(logits, targets, temperature) / (count * batch_size)
        else:
            inputs = draw(data.uniform(rng, batch_size))
            with torch.no_grad():
                targets = teachers.ask(inputs)[0]
            logits = student(inputs)
            if version == "avg_logits":
                loss = _kl_sum(logits, targets.mean(dim=0), temperature) / batch_size
            else:
                loss = _kl_sum(logits.expand_as(targets), targets, temperature) / (count * batch_size)
        if guard is not None:
            loss = guard.guard(loss)
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
