"""partition = "dirichlet_fixed_per_device": shards of exactly `client_data_size` samples, each drawn from the
run's seed and the device's id alone.

The same kind of shard as `dirichlet_fixed` (fixed_shards.py): per-device Dirichlet class shares, rounded as
FedRevive rounds them, samples distinct within a device and overlapping across devices. What differs is the
randomness: `dirichlet_fixed` deals every device from one stream in device order (device d costs the deal of
every device before it), while here device d has a generator of its own, seeded by (seed, stream, d), and takes
each class's samples at random from the whole class. A device's shard costs the same whatever its id and
whichever devices were drawn before, and nothing is kept per device: what a million-device run should use.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import overload

import numpy as np

from fedqueue.errors import ConfigError, DataError
from fedqueue.fl.ml.fixed_shards import class_counts

DEVICE_SHARD_STREAM = 0xD5C5  # apart from dirichlet_fixed's stream and every other use of the run's seed


class DeviceShards(Sequence[np.ndarray]):
    """Device d's shard of exactly `size` positions, computed from (seed, d) each time it is read."""

    def __init__(
        self,
        labels: np.ndarray,
        num_devices: int,
        size: int,
        alpha: float,
        num_classes: int,
        seed: int,
        into: np.ndarray | None = None,
    ) -> None:
        """`into`: positions the shards index (a shard holds `into[p]` for each drawn p; the default, p itself)."""
        if size < 1:
            raise ConfigError(f"client_data_size: must be a positive integer, got {size}")
        self.num_devices, self.size, self.num_classes, self.seed = num_devices, size, num_classes, seed
        labels = np.asarray(labels).reshape(-1)
        positions = np.arange(len(labels)) if into is None else np.asarray(into)
        # Each class's positions, once: the only table kept, and it grows with the data, not the devices.
        self._members = [positions[labels == label].astype(np.int64) for label in range(num_classes)]
        self._alpha = np.full(num_classes, alpha)

    def __len__(self) -> int:
        return self.num_devices

    @overload
    def __getitem__(self, device: int) -> np.ndarray: ...

    @overload
    def __getitem__(self, device: slice) -> Sequence[np.ndarray]: ...

    def __getitem__(self, device: int | slice) -> np.ndarray | Sequence[np.ndarray]:
        if isinstance(device, slice):
            return [self[index] for index in range(*device.indices(self.num_devices))]
        if not -self.num_devices <= device < self.num_devices:
            raise IndexError(f"device {device} out of range for {self.num_devices} devices")
        return self.shard(device % self.num_devices)

    def sizes(self) -> np.ndarray:
        """Every device's sample count, without drawing any shard."""
        return np.full(self.num_devices, self.size, dtype=np.int64)

    def shares(self, device: int) -> np.ndarray:
        """Device `device`'s Dirichlet class proportions (the first draw of its generator)."""
        return self._shares(self._rng(device))

    def shard(self, device: int) -> np.ndarray:
        """Device `device`'s positions, class by class in class order."""
        rng = self._rng(device)
        chosen = []
        for label, wanted in enumerate(class_counts(self._shares(rng).tolist(), self.size, rng)):
            if wanted == 0:
                continue
            members = self._members[label]
            if wanted > len(members):
                raise DataError(
                    f"client_data_size: device {device} needs {wanted} samples of class {label},"
                    f" the training pool holds {len(members)}"
                )
            chosen.append(members[rng.choice(len(members), wanted, replace=False)])
        shard = np.concatenate(chosen)
        shard.setflags(write=False)
        return shard

    def _rng(self, device: int) -> np.random.Generator:
        return np.random.default_rng([self.seed, DEVICE_SHARD_STREAM, device])

    def _shares(self, rng: np.random.Generator) -> np.ndarray:
        shares = rng.dirichlet(self._alpha)
        if not np.all(np.isfinite(shares)):  # tiny alphas can underflow (NaN): all to one class
            shares = np.zeros(self.num_classes)
            shares[int(rng.integers(self.num_classes))] = 1.0
        return shares
