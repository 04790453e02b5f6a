"""Images for distillation when the server holds no data: FedRevive's data-free synthesizer. Pure: no I/O.

A class-conditional generator maps noise and a label to an input the teachers (recent local
models) classify as that label. Each call to `synthesize`:

1. draws labels from the teachers' pooled class proportions, and fresh noise;
2. copies the generator and trains the copy, with the noise, `g_steps` Adam steps on
   - oh:  the teachers' cross-entropy on the labels, each teacher's term weighted by how much
          of that label its device holds (a teacher never taught a class it never saw);
   - bn:  the distance of the batch's feature statistics from each teacher's BatchNorm running
          statistics, or its StatTrackers' (fl/ml/stat_resnet.py; 0 for models with neither);
   - adv: after warmup, minus the student's divergence from the teachers where they agree,
          so new images sit where the student still disagrees;
3. moves the generator toward the trained copy (a Reptile meta-step), so each call starts from
   a generator that adapts in a few steps;
4. adds the copy's lowest-loss batch to a bounded pool, which distillation samples from.

All randomness comes from torch's global generator: the caller seeds it. `state_dict` holds
everything (generator, its optimizer, the pool), so a synthesizer loaded from it continues
exactly as the one that wrote it.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fedqueue.fl.ml.stat_resnet import StatTracker


@dataclass(frozen=True)
class SynthesisSettings:
    nz: int = 256  # noise size
    ngf: int = 128  # generator width
    synth_batch_size: int = 64  # images made per call
    g_steps: int = 2  # steps of the generator's copy per call
    lr_g: float = 3e-3
    lr_z: float = 1e-3
    adv: float = 0.1  # weights of the three losses
    bn: float = 0.003
    oh: float = 1.0
    class_embedding_weight: float = 0.2  # how strongly the label steers the noise
    warmup_rounds: int = 100  # versions made before the adversarial loss (and the student's distillation)
    pool_size: int = 10_000  # images kept; the oldest go first


def image_shape(input_shape: tuple[int, ...]) -> tuple[int, int, int]:
    """The (channels, height, width) the generator draws: the input's, or a square for a flat input."""
    if len(input_shape) == 3:
        return (int(input_shape[0]), int(input_shape[1]), int(input_shape[2]))
    size = math.prod(input_shape)
    side = math.isqrt(size)
    return (1, side, side) if side * side == size else (1, 1, size)


class Generator(nn.Module):
    """Noise plus a scaled label embedding, upsampled twice by convolutions to an image."""

    def __init__(self, nz: int, ngf: int, shape: tuple[int, int, int], num_classes: int, label_weight: float):
        super().__init__()
        channels, height, width = shape
        self.shape, self.label_weight = shape, label_weight
        self.start = (max(1, height // 4), max(1, width // 4))
        self.embed = nn.Embedding(num_classes, nz)
        self.project = nn.Linear(nz, 2 * ngf * self.start[0] * self.start[1])
        self.ngf = ngf
        self.body = nn.Sequential(
            nn.BatchNorm2d(2 * ngf),
            nn.Upsample(scale_factor=2),
            nn.Conv2d(2 * ngf, 2 * ngf, 3, padding=1, bias=False),
            nn.BatchNorm2d(2 * ngf),
            nn.LeakyReLU(0.2),
            nn.Upsample(scale_factor=2),
            nn.Conv2d(2 * ngf, ngf, 3, padding=1, bias=False),
            nn.BatchNorm2d(ngf),
            nn.LeakyReLU(0.2),
            nn.Conv2d(ngf, channels, 3, padding=1),
            nn.BatchNorm2d(channels, affine=False),  # standardised images, as inputs usually are
        )

    def forward(self, z: Tensor, labels: Tensor) -> Tensor:
        code = z + self.label_weight * self.embed(labels)
        x = self.project(code).view(len(z), 2 * self.ngf, *self.start)
        x = self.body(x)
        if tuple(x.shape[-2:]) != self.shape[1:]:
            x = F.interpolate(x, size=self.shape[1:], mode="bilinear", align_corners=False)
        images: Tensor = x
        return images


def _tracks_statistics(layer: nn.Module) -> bool:
    """BatchNorm with running statistics, or a StatTracker: both see a convolution's output and keep its mean
    and variance, so one hook reads either."""
    if isinstance(layer, StatTracker):
        return True
    return isinstance(layer, nn.BatchNorm1d | nn.BatchNorm2d) and layer.running_mean is not None


class _FeatureStats:
    """Forward hooks on a model's BatchNorm layers or StatTrackers: how far a batch's statistics are from the
    running ones."""

    def __init__(self, model: nn.Module) -> None:
        self.losses: list[Tensor] = []
        self.handles = [
            layer.register_forward_hook(self._hook) for layer in model.modules() if _tracks_statistics(layer)
        ]

    def _hook(self, layer: nn.Module, inputs: tuple[Tensor, ...], _: Tensor) -> None:
        features = inputs[0]
        dims = [0] if features.dim() == 2 else [0, 2, 3]
        mean = features.mean(dim=dims)
        var = features.var(dim=dims, unbiased=False)
        assert isinstance(layer.running_mean, Tensor) and isinstance(layer.running_var, Tensor)
        self.losses.append(torch.norm(mean - layer.running_mean, 2) + torch.norm(var - layer.running_var, 2))

    def take(self) -> Tensor | None:
        total = torch.stack(self.losses).sum() if self.losses else None
        self.losses = []
        return total

    def close(self) -> None:
        for handle in self.handles:
            handle.remove()


def augment_images(images: Tensor) -> Tensor:
    """A random shift (zero padding of an eighth) per batch, and a random horizontal flip per colour image."""
    height, width = images.shape[-2:]
    pad = max(1, height // 8)
    padded = F.pad(images, (pad, pad, pad, pad))
    top, left = (int(v) for v in torch.randint(0, 2 * pad + 1, (2,)))
    shifted = padded[..., top : top + height, left : left + width]
    if images.shape[1] == 3:
        flip = torch.rand(len(images), device=images.device) < 0.5
        shifted = torch.where(flip[:, None, None, None], shifted.flip(-1), shifted)
    return shifted


class Synthesizer:
    """The generator, its meta-optimiser and the pool of images made so far."""

    def __init__(self, settings: SynthesisSettings, input_shape: tuple[int, ...], num_classes: int) -> None:
        self.settings, self.input_shape, self.num_classes = settings, tuple(input_shape), num_classes
        self.image = image_shape(self.input_shape)
        self.generator = Generator(settings.nz, settings.ngf, self.image, num_classes, settings.class_embedding_weight)
        # Reptile: the meta-step moves by the copy's whole change, so its rate is g_steps times the copy's.
        self.meta_optimizer = torch.optim.Adam(
            self.generator.parameters(), lr=settings.lr_g * settings.g_steps, betas=(0.5, 0.999)
        )
        self.pool_x = torch.zeros((0, *self.image))
        self.pool_y = torch.zeros(0, dtype=torch.int64)

    def _labels(self, proportions: Sequence[np.ndarray], size: int) -> Tensor:
        pooled = torch.as_tensor(np.mean(np.stack(proportions), axis=0), dtype=torch.float64)
        if float(pooled.sum()) <= 0:
            pooled = torch.ones(self.num_classes, dtype=torch.float64)
        return torch.multinomial(pooled / pooled.sum(), size, replacement=True)

    def _inputs(self, images: Tensor) -> Tensor:
        return images.reshape(len(images), *self.input_shape)

    def synthesize(
        self, teachers: Sequence[nn.Module], proportions: Sequence[np.ndarray], student: nn.Module, current_round: int
    ) -> dict[str, float]:
        """Train the generator from these teachers and add a batch to the pool; returns the last losses."""
        settings = self.settings
        teacher_device = next(teachers[0].parameters()).device
        self.generator.to(teacher_device)
        labels = self._labels(proportions, settings.synth_batch_size).to(teacher_device)
        # How much each teacher speaks for each label: its device's share of it, across teachers.
        shares = torch.as_tensor(np.stack(proportions), dtype=torch.float32, device=teacher_device)
        per_label = shares[:, labels] / shares[:, labels].sum(dim=0).clamp_min(1e-12)
        z = torch.randn(settings.synth_batch_size, settings.nz, device=teacher_device, requires_grad=True)
        fast = copy.deepcopy(self.generator).train()
        groups: list[dict[str, Any]] = [{"params": list(fast.parameters())}, {"params": [z], "lr": settings.lr_z}]
        optimizer = torch.optim.Adam(
            groups,
            lr=settings.lr_g,
            betas=(0.5, 0.999),
        )
        trackers = [_FeatureStats(teacher) for teacher in teachers]
        for teacher in teachers:
            teacher.eval()
        student.eval()
        best: tuple[float, Tensor] | None = None
        parts: dict[str, float] = {}
        try:
            for _ in range(settings.g_steps):
                images = fast(z, labels)
                inputs = self._inputs(augment_images(images))
                logits = [teacher(inputs) for teacher in teachers]
                oh = torch.stack(
                    [
                        (F.cross_entropy(out, labels, reduction="none") * per_label[index]).mean()
                        for index, out in enumerate(logits)
                    ]
                ).sum()
                stats = [tracker.take() for tracker in trackers]
                bn_terms = [term for term in stats if term is not None]
                bn = torch.stack(bn_terms).mean() if bn_terms else torch.zeros((), device=teacher_device)
                adv = torch.zeros((), device=teacher_device)
                if current_round > settings.warmup_rounds and settings.adv > 0:
                    ensemble = torch.stack(logits).mean(dim=0)
                    student_logits = student(inputs)
                    agree = (student_logits.argmax(1) == ensemble.argmax(1)).float()
                    divergence = F.kl_div(
                        F.log_softmax(student_logits, dim=1), F.softmax(ensemble, dim=1), reduction="none"
                    ).sum(1)
                    adv = -(divergence * agree).mean()
                loss = settings.oh * oh + settings.bn * bn + settings.adv * adv
                if best is None or float(loss.detach()) < best[0]:
                    best = (float(loss.detach()), images.detach().clone())
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                parts = {
                    name: float(term.detach()) for name, term in (("oh", oh), ("bn", bn), ("adv", adv), ("loss", loss))
                }
        finally:
            for tracker in trackers:
                tracker.close()
        self._meta_step(fast)
        assert best is not None
        self._add(best[1].cpu(), labels.cpu())
        return parts

    def _meta_step(self, fast: nn.Module) -> None:
        """Reptile: the generator's gradient is its distance from the trained copy."""
        self.meta_optimizer.zero_grad()
        for meta, trained in zip(self.generator.parameters(), fast.parameters(), strict=True):
            meta.grad = (meta.detach() - trained.detach()).clone()
        self.meta_optimizer.step()
        # BatchNorm statistics are not parameters: the generator takes the copy's.
        for meta_buffer, trained_buffer in zip(self.generator.buffers(), fast.buffers(), strict=True):
            meta_buffer.copy_(trained_buffer)

    def _add(self, images: Tensor, labels: Tensor) -> None:
        keep = self.settings.pool_size
        self.pool_x = torch.cat([self.pool_x, images])[-keep:]
        self.pool_y = torch.cat([self.pool_y, labels])[-keep:]

    def pool(self) -> tuple[Tensor, Tensor]:
        """The images made so far, shaped as the model's inputs, and their labels."""
        return self._inputs(self.pool_x), self.pool_y

    def augment(self, inputs: Tensor) -> Tensor:
        """What distillation applies to pool batches: the synthesis's own augmentation."""
        images = inputs.reshape(len(inputs), *self.image)
        return self._inputs(augment_images(images))

    def state_dict(self) -> dict[str, Tensor]:
        state = {f"generator.{name}": value.detach().cpu() for name, value in self.generator.state_dict().items()}
        for index, slot in self.meta_optimizer.state_dict()["state"].items():
            for key, value in slot.items():
                state[f"optimizer.{index}.{key}"] = torch.as_tensor(value).detach().cpu()
        state["pool.x"], state["pool.y"] = self.pool_x.contiguous(), self.pool_y.contiguous()
        return {name: value.contiguous() for name, value in state.items()}

    def load_state_dict(self, state: Mapping[str, Tensor]) -> None:
        prefix = "generator."
        self.generator.load_state_dict({k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)})
        slots: dict[int, dict[str, Tensor]] = {}
        for name, value in state.items():
            if name.startswith("optimizer."):
                _, index, key = name.split(".", 2)
                slots.setdefault(int(index), {})[key] = value.clone()
        saved = self.meta_optimizer.state_dict()
        self.meta_optimizer.load_state_dict({"state": slots, "param_groups": saved["param_groups"]})
        self.pool_x, self.pool_y = state["pool.x"].clone(), state["pool.y"].clone()
