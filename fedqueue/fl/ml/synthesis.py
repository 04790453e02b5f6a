"""Images for distillation when the server holds no data: FedRevive's data-free synthesizer. Pure: no I/O.

A class-conditional generator maps noise plus a scaled class embedding to an image (a sigmoid,
stretched to the data's per-channel range: FedRevive's sigmoid then normalize). Each call to
`synthesize`, as the authors' `FastMetaSynthesizer.synthesize` does it:

1. draws fresh noise, labels from the teachers' pooled class proportions, and fresh class embeddings;
2. copies the generator and trains the copy, the noise and the embeddings `g_steps` Adam steps on
   three terms, each teacher's share of a sample set by how much of its label the teacher's device
   holds against the other teachers' devices (w_k(y) = q_k(y) / sum_t q_t(y)):
   - oh:  the teachers' cross-entropy on the labels;
   - bn:  each teacher's distance of the batch's feature statistics from its own (BatchNorm running
          statistics or StatTrackers, fl/ml/stat_resnet.py; 0 for models with neither);
   - adv: once the adversarial gate opens, minus the student's divergence from each teacher where
          they agree, so new images sit where the student still disagrees;
   each term guarded against spikes (fl/ml/loss_window.py);
3. moves the generator toward the trained copy (a Reptile step through Adam with eps 0);
4. adds the copy's lowest-loss batch to a bounded pool, which distillation samples from.

Images are cropped (reflect padding) and flipped per image before the teachers see them. The
teachers are asked in one vmapped call (fl/ml/teacher_stack.py), and nothing in a call waits on the
host until its losses are read. All randomness comes from torch's global CPU generator: the caller
seeds it. `state_dict` holds everything (generator, its optimizer, the pool, the call count, the loss
windows), so a synthesizer loaded from it continues exactly as the one that wrote it.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fedqueue.fl.ml.augment import Augmentation, apply, draw
from fedqueue.fl.ml.loss_window import LossWindow
from fedqueue.fl.ml.teacher_stack import TeacherStack
from fedqueue.fl.ml.torch_device import host_to_device

ADV_GATES = ("calls", "version")  # what opens the adversarial term: synthesis calls made, or versions made
LOSS_TERMS = ("bn", "oh", "adv", "kd")  # each with a spike window; kd is the distillation's


@dataclass(frozen=True)
class SynthesisSettings:
    """The data-free synthesizer's knobs in the `dfkd` table, named as in FedRevive's `dfkd_settings`."""

    nz: int = 256
    """Size of the generator's noise (`nz`)."""
    ngf: int = 128
    """The generator's width (`ngf`)."""
    synth_batch_size: int = 64
    """Images made per synthesis call (`synth_batch_size`)."""
    g_steps: int = 2
    """Steps of the generator's copy per synthesis call (`g_steps`)."""
    lr_g: float = 3e-3
    """Learning rate of the generator, and of its Reptile step (`lr_g`)."""
    lr_z: float = 1e-3
    """Learning rate of the noise and the class embeddings (`lr_z`)."""
    adv: float = 0.1
    """Weight of the adversarial loss (`adv`)."""
    bn: float = 0.003
    """Weight of the feature-statistics loss (`bn`)."""
    oh: float = 1.0
    """Weight of the teachers' cross-entropy (`oh`)."""
    class_embedding_weight: float = 0.2
    """How strongly the label steers the noise (`class_embedding_weight`)."""
    warmup_rounds: int = 100
    """Versions made before the student distils, and the adversarial gate's threshold (`warmup_rounds`)."""
    adv_gate: str = "calls"
    """What opens the adversarial term: `calls`, from the `warmup_rounds`-th synthesis call (the authors'
    simulator), or `version`, from version `warmup_rounds` on (their FLARE port)."""
    pool_size: int = 16_000
    """Images kept for distillation, the oldest dropped first (`max_images`)."""


def image_shape(input_shape: tuple[int, ...]) -> tuple[int, int, int]:
    """The (channels, height, width) the generator draws: the input's, or a square for a flat input."""
    if len(input_shape) == 3:
        return (int(input_shape[0]), int(input_shape[1]), int(input_shape[2]))
    size = math.prod(input_shape)
    side = math.isqrt(size)
    return (1, side, side) if side * side == size else (1, 1, size)


class Generator(nn.Module):
    """Noise plus a scaled class embedding, upsampled twice by convolutions to an image in the data's range."""

    low: Tensor
    span: Tensor

    def __init__(self, nz: int, ngf: int, shape: tuple[int, int, int], pixel_range: tuple[Tensor, Tensor]):
        super().__init__()
        channels, height, width = shape
        self.shape, self.ngf = shape, ngf
        self.start = (max(1, height // 4), max(1, width // 4))
        self.project = nn.Linear(nz, 2 * ngf * self.start[0] * self.start[1])
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
            nn.Sigmoid(),
        )
        # The sigmoid's [0, 1] stretched to each channel's range in the data: a pixel scale then the
        # data's normalization, as the authors' generator and their Normalize do it.
        low, high = pixel_range
        self.register_buffer("low", low.reshape(1, channels, 1, 1).clone(), persistent=False)
        self.register_buffer("span", (high - low).reshape(1, channels, 1, 1).clone(), persistent=False)

    def forward(self, z: Tensor, labels: Tensor, embeddings: Tensor, weight: float) -> Tensor:
        code = z + weight * embeddings[labels]
        x = self.project(code).view(len(z), 2 * self.ngf, *self.start)
        x = self.body(x)
        if tuple(x.shape[-2:]) != self.shape[1:]:
            x = F.interpolate(x, size=self.shape[1:], mode="bilinear", align_corners=False)
        images: Tensor = self.low + self.span * x
        return images


def weighted_terms(
    logits: Tensor, distances: Tensor, labels: Tensor, weights: Tensor, student_logits: Tensor | None
) -> tuple[Tensor, Tensor, Tensor]:
    """The synthesis's three loss terms, before their weights: feature statistics, cross-entropy, adversarial.

    logits: (teachers, samples, classes); distances: each teacher's statistics distance (teachers,);
    weights: each teacher's share of each sample (samples, teachers); student_logits: (samples, classes),
    None while the adversarial gate is shut (that term is then 0). Each term sums its per-teacher parts,
    weighted, over the samples and divides by their number."""
    count, size, classes = logits.shape
    bn = (weights.sum(dim=0) * distances).sum() / size
    ce = F.cross_entropy(logits.reshape(-1, classes), labels.repeat(count), reduction="none").view(count, size)
    oh = (weights * ce.T).sum() / size
    if student_logits is None:
        return bn, oh, torch.zeros((), device=logits.device)
    agree = (student_logits.argmax(dim=1) == logits.argmax(dim=2)).to(logits.dtype)  # (teachers, samples)
    divergence = F.kl_div(
        F.log_softmax(student_logits, dim=1).expand_as(logits), F.softmax(logits, dim=2), reduction="none"
    ).sum(dim=2)
    adv = (weights * (-(divergence * agree)).T).sum() / size
    return bn, oh, adv


def _crop_pad(shape: tuple[int, int, int]) -> int:
    """How far the server's crop shifts: 4 pixels of a 32-pixel image, an eighth in general; 0 for flat inputs."""
    side = min(shape[1], shape[2])
    return side // 8 if side >= 8 else 0


class Synthesizer:
    """The generator, its meta-optimiser, the pool of images made so far, and the loss windows."""

    def __init__(
        self,
        settings: SynthesisSettings,
        input_shape: tuple[int, ...],
        num_classes: int,
        *,
        pixel_range: tuple[Tensor, Tensor] | None = None,
        rotate: bool = False,
    ) -> None:
        if settings.adv_gate not in ADV_GATES:
            raise ValueError(f"adv_gate: one of {', '.join(ADV_GATES)}, got {settings.adv_gate!r}")
        self.settings, self.input_shape, self.num_classes = settings, tuple(input_shape), num_classes
        self.image = image_shape(self.input_shape)
        channels = self.image[0]
        if pixel_range is None:
            pixel_range = (torch.zeros(channels), torch.ones(channels))
        low, high = (bound.to(torch.float32) for bound in pixel_range)
        self.generator = Generator(settings.nz, settings.ngf, self.image, (low, high))
        # Reptile through Adam with eps 0: the first step moves every weight by exactly lr_g.
        self.meta_optimizer = torch.optim.Adam(self.generator.parameters(), lr=settings.lr_g, betas=(0.5, 0.999), eps=0)
        pad = _crop_pad(self.image)
        # Padding by reflection; a rotation fills with the channel's darkest value (black, normalized).
        self.augmentation = Augmentation(rotate=rotate, fill=tuple(low.tolist()), reflect=True, pad=pad)
        self.pool_x = torch.zeros((0, *self.image))
        self.pool_y = torch.zeros(0, dtype=torch.int64)
        self.calls = 0
        self.windows = {term: LossWindow() for term in LOSS_TERMS}

    def _inputs(self, images: Tensor) -> Tensor:
        return images.reshape(len(images), *self.input_shape)

    def augment_images(self, images: Tensor) -> Tensor:
        """Per image: a crop of the image padded by reflection, a horizontal flip for colour images, and the
        rotation where the run's devices rotate theirs; draws from torch's global CPU generator."""
        if self.augmentation.pad == 0:
            return images
        draws = draw(self.augmentation, torch.default_generator, len(images))
        if images.shape[1] != 3:  # a grey image (a digit) is not flipped
            draws = replace(draws, flip=torch.zeros_like(draws.flip))
        return apply(self.augmentation, images, draws)

    def adversarial(self, current_round: int) -> bool:
        """Whether this call's generator is pushed away from the student (after `self.calls` is counted)."""
        settings = self.settings
        seen = self.calls if settings.adv_gate == "calls" else current_round
        return settings.adv > 0 and seen >= settings.warmup_rounds

    def synthesize(
        self, teachers: TeacherStack, proportions: Tensor, student: nn.Module, current_round: int
    ) -> dict[str, Tensor]:
        """Train the generator from these teachers (proportions: one row of class shares per teacher) and add
        a batch to the pool; returns the last step's losses, still on the device."""
        settings = self.settings
        device = next(teachers.teachers[0].parameters()).device
        self.calls += 1
        self.generator.to(device)
        size = settings.synth_batch_size
        # Drawn on the CPU, in the authors' order, so a call draws the same on any device.
        z = host_to_device(torch.randn(size, settings.nz), device).requires_grad_()
        q = proportions.to(torch.float32).cpu()
        labels = host_to_device(torch.multinomial(q.mean(dim=0), size, replacement=True), device)
        embeddings = host_to_device(torch.randn(self.num_classes, settings.nz), device).requires_grad_()
        # Each teacher's share of each sample: w_k(y) = q_k(y) / sum_t q_t(y).
        shares = host_to_device(q / q.sum(dim=0, keepdim=True).clamp_min(1e-8), device)
        weights = shares[:, labels].T  # (samples, teachers)
        fast = copy.deepcopy(self.generator).train()
        groups: list[dict[str, Any]] = [
            {"params": list(fast.parameters())},
            {"params": [z], "lr": settings.lr_z},
            {"params": [embeddings], "lr": settings.lr_z},
        ]
        optimizer = torch.optim.Adam(groups, lr=settings.lr_g, betas=(0.5, 0.999))
        student.eval()
        adversarial = self.adversarial(current_round)
        best_loss = torch.full((), math.inf, device=device)
        best_images = torch.zeros((size, *self.image), device=device)
        parts: dict[str, Tensor] = {}
        for _ in range(settings.g_steps):
            images = fast(z, labels, embeddings, settings.class_embedding_weight)
            inputs = self._inputs(self.augment_images(images))
            logits, distances = teachers.ask(inputs)  # (teachers, samples, classes), (teachers,)
            student_logits = student(inputs) if adversarial else None
            bn, oh, adv = weighted_terms(logits, distances, labels, weights, student_logits)
            zero = torch.zeros((), device=device)
            bn = self._guarded("bn", bn) if settings.bn > 0 else zero
            oh = self._guarded("oh", oh)
            adv = self._guarded("adv", adv) if adversarial else zero
            loss = settings.bn * bn + settings.oh * oh + settings.adv * adv
            better = loss.detach() < best_loss
            best_loss = torch.where(better, loss.detach(), best_loss)
            best_images = torch.where(better, images.detach(), best_images)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            parts = {"oh": oh.detach(), "bn": bn.detach(), "adv": adv.detach(), "loss": loss.detach()}
        parts["best"] = best_loss
        self._meta_step(fast)
        self._add(best_images.cpu(), labels.cpu())
        return parts

    def _guarded(self, term: str, loss: Tensor) -> Tensor:
        """A term through its spike window, as the authors guard every term they weigh above 0."""
        weight: float = getattr(self.settings, term)
        return self.windows[term].guard(loss) if weight > 0 else loss

    def _meta_step(self, fast: nn.Module) -> None:
        """Reptile: the generator's gradient is its distance from the trained copy (its BatchNorm statistics
        stay: the copies train in batch-statistics mode, so they are never read)."""
        self.meta_optimizer.zero_grad()
        for meta, trained in zip(self.generator.parameters(), fast.parameters(), strict=True):
            meta.grad = meta.detach() - trained.detach()
        self.meta_optimizer.step()

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
        return self._inputs(self.augment_images(images))

    def state_dict(self) -> dict[str, Tensor]:
        state = {f"generator.{name}": value.detach().cpu() for name, value in self.generator.state_dict().items()}
        for index, slot in self.meta_optimizer.state_dict()["state"].items():
            for key, value in slot.items():
                state[f"optimizer.{index}.{key}"] = torch.as_tensor(value).detach().cpu()
        state["pool.x"], state["pool.y"] = self.pool_x, self.pool_y
        state["calls"] = torch.tensor(self.calls, dtype=torch.int64)
        for term, window in self.windows.items():
            state[f"window.{term}"] = window.state()
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
        self.calls = int(state["calls"])
        for term, window in self.windows.items():
            window.load(state[f"window.{term}"])
