"""Train-time augmentation of a device's batches, as FedRevive's clients do it: a random 32-pixel crop of
the image padded by 4 black pixels, a horizontal flip, and (for CIFAR-100) a rotation of up to 15 degrees.

Drawn per sample from a generator of the device's own (its task seed's), apart from the batch
order's: a device's update is the same in any worker, alone or in a vmapped pack.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from fedqueue.errors import ConfigError
from fedqueue.fl.ml.data_section import AUGMENT_SIZE, AUGMENTS
from fedqueue.fl.ml.seeding import task_seed
from fedqueue.fl.ml.torch_device import host_to_device

PAD = 4
ROTATION_DEGREES = 15.0
AUGMENT_STREAM = 0xA06E  # keeps the augmentation's draws apart from the batch order's


@dataclass(frozen=True)
class Augmentation:
    """What is applied, and the padding's value per channel (empty: zero in every channel).

    `reflect` pads by mirroring the image instead (the server's synthesis and distillation crop so);
    `pad` is how far the crop may shift.
    """

    rotate: bool
    fill: tuple[float, ...] = ()
    reflect: bool = False
    pad: int = PAD


def augmentation(name: str, fill: tuple[float, ...] = ()) -> Augmentation | None:
    """The augmentation an `augment` knob names (None for "none")."""
    if name not in AUGMENTS:
        raise ConfigError(f"augment: unknown augment {name!r} (choose from {', '.join(AUGMENTS)})")
    return None if name == "none" else Augmentation(rotate=name == "crop_flip_rotate", fill=fill)


def augment_generator(seed: int) -> torch.Generator:
    """The device's augmentation generator, from the seed its batch order is drawn with."""
    return torch.Generator(device="cpu").manual_seed(task_seed(seed, AUGMENT_STREAM, 0))


@dataclass(frozen=True)
class Draws:
    """Per sample: the crop's top-left corner in the padded image, whether to flip, the angle in degrees."""

    top: Tensor
    left: Tensor
    flip: Tensor
    angle: Tensor | None


def draw(aug: Augmentation, generator: torch.Generator, count: int) -> Draws:
    """One batch's draws, on the CPU, always in the same order (so they never depend on the training device)."""
    corners = torch.randint(0, 2 * aug.pad + 1, (2, count), generator=generator)
    flip = torch.rand(count, generator=generator) < 0.5
    angle = None
    if aug.rotate:
        angle = (torch.rand(count, generator=generator, dtype=torch.float64) * 2 - 1) * ROTATION_DEGREES
    return Draws(top=corners[0], left=corners[1], flip=flip, angle=angle)


def _fill(aug: Augmentation, channels: int, like: Tensor) -> Tensor:
    if not aug.fill:
        return torch.zeros(1, channels, 1, 1, dtype=like.dtype, device=like.device)
    if len(aug.fill) != channels:
        raise ConfigError(f"augment: {len(aug.fill)} fill values for {channels}-channel images")
    return host_to_device(torch.tensor(aug.fill, dtype=like.dtype), like.device).view(1, channels, 1, 1)


def _rotate(images: Tensor, degrees: Tensor, fill: Tensor) -> Tensor:
    """Rotate about the centre, nearest pixel, the corners filled (torchvision's RandomRotation defaults)."""
    radians = host_to_device(degrees, images.device) * (math.pi / 180)
    cos, sin = torch.cos(radians), torch.sin(radians)
    zero = torch.zeros_like(cos)
    theta = torch.stack([torch.stack([cos, -sin, zero], 1), torch.stack([sin, cos, zero], 1)], 1).to(images.dtype)
    grid = F.affine_grid(theta, list(images.shape), align_corners=False)
    # Sampled around the fill, so the area outside the image becomes the fill, not zero.
    return F.grid_sample(images - fill, grid, mode="nearest", padding_mode="zeros", align_corners=False) + fill


def apply(aug: Augmentation, images: Tensor, draws: Draws) -> Tensor:
    """The batch (N, C, H, W) cropped, flipped and rotated as drawn."""
    if images.dim() != 4:
        raise ConfigError(f"augment: needs (channels, height, width) images, got inputs of shape {tuple(images.shape)}")
    count, channels, height, width = images.shape
    fill = _fill(aug, channels, images)
    pad = aug.pad
    if aug.reflect:
        padded = F.pad(images, (pad, pad, pad, pad), mode="reflect")
    else:
        padded = fill.expand(count, channels, height + 2 * pad, width + 2 * pad).clone()
        padded[..., pad : pad + height, pad : pad + width] = images
    rows = host_to_device(draws.top, images.device)[:, None] + torch.arange(height, device=images.device)
    cols = host_to_device(draws.left, images.device)[:, None] + torch.arange(width, device=images.device)
    samples = torch.arange(count, device=images.device)[:, None, None]
    cropped = padded[samples, :, rows[:, :, None], cols[:, None, :]].permute(0, 3, 1, 2)  # (N, H, W, C) -> NCHW
    out = torch.where(host_to_device(draws.flip, images.device)[:, None, None, None], cropped.flip(-1), cropped)
    if draws.angle is not None:
        out = _rotate(out, draws.angle, fill)
    return out.contiguous()


def check_image_size(images: Tensor) -> None:
    """A device's batch (N, C, 32, 32), else one line naming `augment` and the shape: on other images (8x8 digits,
    flat inputs) the crop and rotation leave too little of them, and a run trains to below chance."""
    if images.dim() != 4 or tuple(images.shape[2:]) != AUGMENT_SIZE:
        shape = "x".join(str(size) for size in images.shape[1:])
        raise ConfigError(
            f'augment: crops 32x32 images padded by 4 pixels; the dataset\'s are {shape} (set augment = "none")'
        )


def augment_batch(aug: Augmentation, images: Tensor, generator: torch.Generator) -> Tensor:
    """One device's batch, augmented with its generator's next draws."""
    check_image_size(images)
    return apply(aug, images, draw(aug, generator, len(images)))


def augment_stacked(aug: Augmentation, images: Tensor, generators: list[torch.Generator]) -> Tensor:
    """A vmapped pack's batches (members, N, C, H, W): each member's drawn from its own generator."""
    members, count = images.shape[:2]
    check_image_size(images[0])
    parts = [draw(aug, generator, count) for generator in generators]
    angle = None if parts[0].angle is None else torch.cat([p.angle for p in parts if p.angle is not None])
    draws = Draws(
        top=torch.cat([p.top for p in parts]),
        left=torch.cat([p.left for p in parts]),
        flip=torch.cat([p.flip for p in parts]),
        angle=angle,
    )
    flat = apply(aug, images.reshape(members * count, *images.shape[2:]), draws)
    return flat.reshape(images.shape)
