from __future__ import annotations

import pytest
import torch
from torch import nn

from fedqueue.errors import ConfigError
from fedqueue.fl.ml.models import MODELS, build_model, initial_state

SHAPES = [(1, 8, 8), (3, 32, 32)]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("name", MODELS)
def test_forward_gives_batch_by_classes(name: str, shape: tuple[int, ...]) -> None:
    model = build_model(name, shape, 7)
    model.eval()
    with torch.no_grad():
        out = model(torch.randn(3, *shape))
    assert out.shape == (3, 7)
    assert not any(isinstance(m, nn.Dropout) for m in model.modules())


def test_resnet18_uses_a_small_image_stem() -> None:
    small = build_model("resnet18", (1, 8, 8), 10)
    assert isinstance(small.conv1, nn.Conv2d)
    assert small.conv1.in_channels == 1
    assert small.conv1.kernel_size == (3, 3) and small.conv1.stride == (1, 1)
    assert isinstance(small.maxpool, nn.Identity)
    large = build_model("resnet18", (3, 96, 96), 10)
    assert isinstance(large.conv1, nn.Conv2d)
    assert large.conv1.kernel_size == (7, 7) and not isinstance(large.maxpool, nn.Identity)


@pytest.mark.parametrize("name", MODELS)
def test_initial_state_depends_only_on_seed(name: str) -> None:
    rng_before = torch.get_rng_state()
    first = initial_state(name, (3, 32, 32), 10, seed=1)
    assert torch.equal(torch.get_rng_state(), rng_before)
    torch.manual_seed(999)  # the global RNG state must not matter
    again = initial_state(name, (3, 32, 32), 10, seed=1)
    other = initial_state(name, (3, 32, 32), 10, seed=2)
    assert first.keys() == again.keys() == other.keys()
    assert all(torch.equal(first[k], again[k]) for k in first)
    assert not all(torch.equal(first[k], other[k]) for k in first)
    assert all(t.device.type == "cpu" and t.is_contiguous() for t in first.values())
    build_model(name, (3, 32, 32), 10).load_state_dict(first)


def test_initial_state_is_not_aliased_between_calls() -> None:
    first = initial_state("mlp", (1, 8, 8), 10, seed=0)
    next(iter(first.values())).add_(1.0)
    again = initial_state("mlp", (1, 8, 8), 10, seed=0)
    assert not torch.equal(next(iter(first.values())), next(iter(again.values())))


def test_unknown_model_names_the_field() -> None:
    with pytest.raises(ConfigError, match=r"^model: .*'vgg'"):
        build_model("vgg", (3, 32, 32), 10)
    with pytest.raises(ConfigError, match=r"^model: "):
        initial_state("vgg", (3, 32, 32), 10, seed=0)


def test_initial_state_is_thread_safe() -> None:
    import threading

    seeds = list(range(6))
    expected = {seed: initial_state("cnn", (3, 32, 32), 10, seed) for seed in seeds}
    results: dict[int, dict[str, torch.Tensor]] = {}

    def work(seed: int) -> None:
        build_model("cnn", (3, 32, 32), 10)  # unseeded construction in between must not interfere
        results[seed] = initial_state("cnn", (3, 32, 32), 10, seed)

    threads = [threading.Thread(target=work, args=(seed,)) for seed in seeds]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert all(torch.equal(expected[s][k], results[s][k]) for s in seeds for k in expected[s])
