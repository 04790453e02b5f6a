"""Model constructors by name, and seed-determined initial weights."""

from __future__ import annotations

import math
import threading

import torch
from torch import nn

from fedqueue.errors import ConfigError
from fedqueue.fl.ml.plugins import Options, describe_choices, is_valid_name, resolve

MODELS = ("mlp", "cnn", "resnet18")
_HIDDEN = 128
# Images up to this size get ResNet's CIFAR stem (3x3 conv, no max-pool), not the ImageNet one.
_SMALL_IMAGE = 64

# Module init draws from torch's global RNG; tasks run in threads, so construction is
# serialised or one thread's seeding would leak into another's weights.
_INIT_LOCK = threading.RLock()


def _image_shape(name: str, input_shape: tuple[int, ...]) -> tuple[int, int, int]:
    if len(input_shape) != 3:
        raise ConfigError(f"model: {name} needs (channels, height, width) inputs, got {input_shape}")
    channels, height, width = (int(v) for v in input_shape)
    return channels, height, width


def _mlp(input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    return nn.Sequential(
        nn.Flatten(),
        nn.Linear(math.prod(input_shape), _HIDDEN),
        nn.ReLU(),
        nn.Linear(_HIDDEN, num_classes),
    )


def _cnn(input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    channels, height, width = _image_shape("cnn", input_shape)
    if height < 4 or width < 4:
        raise ConfigError(f"model: cnn needs images of at least 4x4, got {height}x{width}")
    # Two 2x2 max-pools (floor division each time) shrink the feature map by 4.
    flat = 64 * (height // 4) * (width // 4)
    return nn.Sequential(
        nn.Conv2d(channels, 32, kernel_size=3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(32, 64, kernel_size=3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(flat, _HIDDEN),
        nn.ReLU(),
        nn.Linear(_HIDDEN, num_classes),
    )


class _GlobalAvgPool(nn.Module):
    """Same output as AdaptiveAvgPool2d(1), whose CUDA backward fails under deterministic mode."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.mean(dim=(2, 3), keepdim=True)


def _resnet18(input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    from torchvision.models import resnet18

    channels, height, width = _image_shape("resnet18", input_shape)
    model = resnet18(weights=None, num_classes=num_classes)
    if max(height, width) <= _SMALL_IMAGE:
        # A 7x7/2 conv plus max-pool would shrink small images to almost nothing.
        model.conv1 = nn.Conv2d(channels, 64, kernel_size=3, stride=1, padding=1, bias=False)
        model.maxpool = nn.Identity()
    elif channels != 3:
        model.conv1 = nn.Conv2d(channels, 64, kernel_size=7, stride=2, padding=3, bias=False)
    # Same init torchvision gives its own convolutions.
    nn.init.kaiming_normal_(model.conv1.weight, mode="fan_out", nonlinearity="relu")
    model.avgpool = _GlobalAvgPool()
    built: nn.Module = model
    return built


def mlp(input_shape: tuple[int, ...], num_classes: int, options: Options) -> nn.Module:
    """Built-in: one hidden layer of 128 units."""
    return _mlp(input_shape, num_classes)


def cnn(input_shape: tuple[int, ...], num_classes: int, options: Options) -> nn.Module:
    """Built-in: the small CIFAR CNN (two conv + max-pool blocks, two linear layers)."""
    return _cnn(input_shape, num_classes)


def resnet18(input_shape: tuple[int, ...], num_classes: int, options: Options) -> nn.Module:
    """Built-in: torchvision's ResNet-18, with a small-image stem for inputs up to 64 pixels."""
    return _resnet18(input_shape, num_classes)


def build_model(name: str, input_shape: tuple[int, ...], num_classes: int, options: Options | None = None) -> nn.Module:
    """A fresh model with random weights from the global RNG (see initial_state).

    `name` is a built-in (mlp, cnn, resnet18) or a plugin's `module:attribute`.
    """
    if not is_valid_name("model", name):
        raise ConfigError(f"model: unknown model {name!r} (choose from {describe_choices('model')})")
    builder = resolve("model", name)
    with _INIT_LOCK:
        model = builder(tuple(input_shape), num_classes, dict(options or {}))
    if not isinstance(model, nn.Module):
        raise ConfigError(f"model: {name!r} returned {type(model).__name__}, not a torch.nn.Module")
    return model


def initial_state(
    name: str, input_shape: tuple[int, ...], num_classes: int, seed: int, options: Options | None = None
) -> dict[str, torch.Tensor]:
    """The model's starting weights, fixed by seed, as contiguous CPU tensors."""
    # Built on the CPU, so only the CPU generator is forked and seeded; CUDA RNGs stay untouched.
    with _INIT_LOCK, torch.random.fork_rng(devices=[]):
        torch.random.default_generator.manual_seed(seed)
        model = build_model(name, input_shape, num_classes, options)
    return {key: value.detach().clone().contiguous() for key, value in model.state_dict().items()}
