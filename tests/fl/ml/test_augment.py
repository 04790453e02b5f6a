"""augment = "crop_flip" / "crop_flip_rotate": per-sample draws, seeded per device task, alone or vmapped."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from fedqueue.errors import ConfigError
from fedqueue.fl.ml.augment import Augmentation, augment_batch, augment_generator, augmentation
from fedqueue.fl.ml.data import blank_pixel
from fedqueue.fl.ml.models import build_model
from fedqueue.fl.ml.pack_train import train_pack
from fedqueue.fl.ml.plugins import TensorData
from fedqueue.fl.ml.seeding import task_seed
from fedqueue.fl.ml.train import LocalTrainConfig, train_local
from fedqueue.fl.setup import train_config
from tests.support.helpers import small_config

CROP_FLIP = Augmentation(rotate=False)
IMAGES = torch.randn(16, 3, 32, 32, generator=torch.Generator().manual_seed(0))


def test_same_seed_same_images_and_another_seed_others() -> None:
    seed = task_seed(5, 3, 7)
    first = augment_batch(CROP_FLIP, IMAGES, augment_generator(seed))
    again = augment_batch(CROP_FLIP, IMAGES, augment_generator(seed))
    other = augment_batch(CROP_FLIP, IMAGES, augment_generator(task_seed(5, 3, 8)))
    assert torch.equal(first, again) and not torch.equal(first, other)
    assert first.shape == IMAGES.shape and not torch.equal(first, IMAGES)


def test_crops_are_shifts_padded_with_the_fill_and_flips_mirror() -> None:
    fill = (-1.0, -2.0, -3.0)
    out = augment_batch(Augmentation(rotate=False, fill=fill), IMAGES, augment_generator(1))
    for image, moved in zip(IMAGES, out, strict=True):
        found = False
        for candidate in (moved, moved.flip(-1)):
            padded = torch.stack([torch.full((40, 40), v) for v in fill])
            padded[:, 4:36, 4:36] = image
            found |= any(
                torch.equal(candidate, padded[:, top : top + 32, left : left + 32])
                for top in range(9)
                for left in range(9)
            )
        assert found


def test_rotation_changes_images_and_keeps_the_fill_outside() -> None:
    aug = Augmentation(rotate=True)
    out = augment_batch(aug, torch.ones(8, 3, 32, 32), augment_generator(2))
    assert out.shape == (8, 3, 32, 32) and set(out.unique().tolist()) <= {0.0, 1.0}
    assert (out == 0).any()


def test_knob_and_fill() -> None:
    assert augmentation("none") is None
    assert augmentation("crop_flip_rotate", blank_pixel("cifar100")) == Augmentation(True, blank_pixel("cifar100"))
    assert blank_pixel("cifar10")[0] == pytest.approx(-0.4914 / 0.2023)
    with pytest.raises(ConfigError, match="^augment:"):
        small_config(augment="flip")
    assert train_config(small_config(dataset="synthetic", augment="crop_flip")).augment == Augmentation(rotate=False)


def _devices() -> list[TensorData]:
    generator = torch.Generator().manual_seed(3)
    return [TensorData(torch.randn(20, 3, 32, 32, generator=generator), torch.arange(20) % 10) for _ in range(3)]


def test_training_is_deterministic_and_augmentation_changes_it_and_vmap_matches() -> None:
    cfg = LocalTrainConfig(4, None, 8, "sgd", 0.05, 0.0, augment=CROP_FLIP)
    datas = _devices()
    torch.manual_seed(0)
    model = build_model("mlp", (3, 32, 32), 10)
    start = {key: value.clone() for key, value in model.state_dict().items()}
    cpu = torch.device("cpu")

    def alone(device: int, config: LocalTrainConfig) -> dict[str, torch.Tensor]:
        model.load_state_dict(start)
        return train_local(model, datas[device], config, task_seed(1, 2, device), cpu).state

    first, again, plain = alone(0, cfg), alone(0, cfg), alone(0, replace(cfg, augment=None))
    assert all(torch.equal(first[k], again[k]) for k in first)
    assert any(not torch.equal(first[k], plain[k]) for k in first)
    model.load_state_dict(start)
    pack = train_pack(model, datas, cfg, [task_seed(1, 2, d) for d in range(3)], cpu).outcomes()
    for device in range(3):
        expected = alone(device, cfg)
        for key, value in pack[device].state.items():
            torch.testing.assert_close(value, expected[key], rtol=1e-4, atol=1e-5)
