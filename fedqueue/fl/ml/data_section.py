"""The data's config section: which dataset, where it is read from, how it is split over the devices and how
each training batch is augmented; the keys data.py, fixed_shards.py and augment.py are given (through fl/setup.py).

Torch-free, as the config that holds it: the names the data code accepts are defined here and imported there.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from fedqueue.errors import ConfigError
from fedqueue.fl.ml.plugins import describe_choices, is_valid_name
from fedqueue.fl.sections.base import Run, choice, positive

PARTITIONS = ("iid", "dirichlet", "dirichlet_fixed", "dirichlet_fixed_per_device")
# Shards of exactly client_data_size samples: one stream over the devices in order, or one generator per device.
FIXED_SIZE_PARTITIONS = ("dirichlet_fixed", "dirichlet_fixed_per_device")
LOCAL_DATASETS = ("cifar10", "cifar100")  # read from data_root, never downloaded
AUGMENTS = ("none", "crop_flip", "crop_flip_rotate")
AUGMENT_SIZE = (32, 32)  # the images a device's augmentation is meant for: CIFAR's
# The built-in datasets' images (channels, height, width): the augmentations crop 32x32 images padded by 4 pixels,
# which on 8x8 digits leaves little of the digit (a run trains, to below chance).
IMAGE_SHAPES = {"digits": (1, 8, 8), "synthetic": (3, 32, 32), "cifar10": (3, 32, 32), "cifar100": (3, 32, 32)}


@dataclass(frozen=True)
class DataSection:
    """The data (every mode)."""

    dataset: str = "digits"
    """`digits` (scikit-learn's, offline), `cifar10` / `cifar100` (torchvision's files, read from `data_root`),
    `synthetic` (CIFAR-shaped, generated), or a plugin's `package.module:attribute`."""
    data_root: str | None = None
    """Folder holding `cifar-10-batches-py/` (or `cifar-100-python/`); needed by `cifar10` and `cifar100`, which
    are never downloaded."""
    samples_per_device: int | None = None
    """Cap on each device's training samples (none: all its share)."""
    partition: str = "iid"
    """How the training set is split over the devices: `iid`, `dirichlet` (label shares drawn from
    Dirichlet(`alpha`)), `dirichlet_fixed` (FedRevive's overlapping shards of exactly `client_data_size`, dealt
    from one random stream over the devices in order), or `dirichlet_fixed_per_device` (the same kind of shard,
    each drawn from the seed and the device's id alone: a device costs the same whatever the device count; use it
    for runs of a million devices)."""
    alpha: float = 0.5
    """Concentration of the `dirichlet` and `dirichlet_fixed*` label draws: smaller is more skewed."""
    # FedRevive's data: partition = "dirichlet_fixed" gives every device exactly client_data_size samples, class
    # shares from its own Dirichlet(alpha) draw, shards overlapping across devices; drawn from the training set
    # left after a fixed seed-42 split takes val_split and the run's kd_split out (fixed_shards.py).
    client_data_size: int | None = None
    """With `partition = "dirichlet_fixed"` or `"dirichlet_fixed_per_device"` (required there): the samples every
    device gets."""
    val_split: float = 0.15
    """With `partition = "dirichlet_fixed"` or `"dirichlet_fixed_per_device"`: the share of the training set split
    off first (with `kd_split`)."""
    # Each batch's random crop (4 px of black padding) and flip, + a 15 degree rotation with "crop_flip_rotate".
    augment: str = "none"
    """Training-batch augmentation: `none`, `crop_flip` (a random 32 px crop of a 4 px zero-padded copy, and a
    horizontal flip) or `crop_flip_rotate` (and up to 15 degrees of rotation)."""

    @property
    def fixed_shards(self) -> bool:
        """Shards of exactly client_data_size (partition = "dirichlet_fixed" or "dirichlet_fixed_per_device")."""
        return self.partition in FIXED_SIZE_PARTITIONS

    @property
    def missing_root(self) -> str | None:
        """The data_root a local dataset needs that does not exist here, else None."""
        if self.dataset in LOCAL_DATASETS and self.data_root is not None and not Path(self.data_root).is_dir():
            return self.data_root
        return None

    def check(self, run: Run) -> None:
        if not is_valid_name("dataset", self.dataset):
            raise ConfigError(f"dataset: unknown dataset {self.dataset!r} (choose from {describe_choices('dataset')})")
        if self.samples_per_device is not None:
            positive("samples_per_device", self.samples_per_device)
        choice("partition", self.partition, PARTITIONS)
        if not self.alpha > 0:
            raise ConfigError(f"alpha: must be greater than 0, got {self.alpha}")
        if self.dataset in LOCAL_DATASETS and self.data_root is None:
            raise ConfigError(f"data_root: the {self.dataset} dataset needs data_root (a local folder)")
        self._check_augment()
        self._check_fixed_shards(run.kd_split)

    def _check_augment(self) -> None:
        choice("augment", self.augment, AUGMENTS)
        shape = IMAGE_SHAPES.get(self.dataset)
        if self.augment != "none" and shape is not None and shape[1:] != AUGMENT_SIZE:
            raise ConfigError(
                f'augment: "{self.augment}" crops 32x32 images padded by 4 pixels; dataset {self.dataset!r} has'
                f' {"x".join(map(str, shape))} images (set augment = "none")'
            )

    def _check_fixed_shards(self, kd_split: float) -> None:
        if not self.fixed_shards:
            if self.client_data_size is not None:
                raise ConfigError(
                    'client_data_size: applies to partition = "dirichlet_fixed" or "dirichlet_fixed_per_device" only'
                )
            return
        if self.client_data_size is None:
            raise ConfigError(f'client_data_size: required with partition = "{self.partition}" (samples per device)')
        positive("client_data_size", self.client_data_size)
        if self.samples_per_device is not None:
            raise ConfigError(
                f'samples_per_device: partition = "{self.partition}" gives exactly client_data_size; unset it'
            )
        for key, share in (("val_split", self.val_split), ("kd_split", kd_split)):
            if not 0 <= share < 1:
                raise ConfigError(f"{key}: a share of the training set in [0, 1), got {share}")
        if self.val_split + kd_split >= 1:
            raise ConfigError(f"val_split: val_split + kd_split = {self.val_split + kd_split} leave no training set")
