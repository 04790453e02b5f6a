"""Datasets as in-memory tensors, split across simulated devices.

Everything is cached per process: a worker asks for the same data on every task.
"""

from __future__ import annotations

import functools
import json
import pickle
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from fedqueue.errors import ConfigError, DataError
from fedqueue.fl.ml.data_section import FIXED_SIZE_PARTITIONS, PARTITIONS
from fedqueue.fl.ml.device_shards import DeviceShards
from fedqueue.fl.ml.fixed_shards import FixedShards, fixed_split
from fedqueue.fl.ml.plugins import DatasetRequest, LoadedDataset, TensorData, describe_choices, is_valid_name, resolve

NUM_CLASSES = 10
CIFAR100_CLASSES = 100

# FedRevive's normalization constants (its simulator's DataTransformManager, and its NVFlare port): their ResNet-18
# has no BatchNorm, so its logits scale with the input and other constants would change every number.
CIFAR10_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR10_STD = (0.2023, 0.1994, 0.2010)
CIFAR100_MEAN = (0.507, 0.487, 0.441)
CIFAR100_STD = (0.268, 0.257, 0.276)
_SYNTHETIC_TRAIN = 4000
_SYNTHETIC_TEST = 1000
# Prototype strength relative to unit noise: learnable, but not in a single step.
_SYNTHETIC_SIGNAL = 0.25
_DIGITS_TEST_FRACTION = 0.2


@dataclass(frozen=True)
class DataSpec:
    """Everything that determines a run's data; hashable, so it keys the caches."""

    dataset: str
    root: str | None = None
    seed: int = 0
    num_devices: int = 1
    partition: str = "iid"  # one of data_section.PARTITIONS
    alpha: float = 0.5
    samples_per_device: int | None = None
    # Share of the training set the server holds out before the devices are partitioned (FedRevive's kd_split).
    server_fraction: float = 0.0
    # dirichlet_fixed(_per_device) (fl/ml/fixed_shards.py, device_shards.py): samples per device, and the shares FedRevive's fixed split
    # takes out of the training set before the shards are drawn (its val_split and kd_split).
    client_data_size: int | None = None
    val_fraction: float = 0.0
    kd_fraction: float = 0.0
    # The run's [plugin] table as canonical JSON: hashable, so the spec still keys the caches.
    options_json: str = "{}"

    @property
    def options(self) -> dict[str, Any]:
        return dict(json.loads(self.options_json))


@dataclass(frozen=True, eq=False)
class FederatedData:
    """A dataset and its split: partitions[d] holds device d's indices into train."""

    train: TensorData
    test: TensorData
    partitions: Sequence[np.ndarray]  # dirichlet_fixed's deal their shards when first read, _per_device's draw one
    num_classes: int
    input_shape: tuple[int, ...]
    server: np.ndarray | None = None  # indices into train the server holds out (no device has them)


def _check_partition_args(num_devices: int, scheme: str, alpha: float, cap: int | None) -> None:
    if scheme not in PARTITIONS:
        raise ConfigError(f"partition: unknown partition {scheme!r} (choose from {', '.join(PARTITIONS)})")
    if num_devices < 1:
        raise ConfigError(f"num_devices: must be >= 1, got {num_devices}")
    if scheme == "dirichlet" and not alpha > 0:
        raise ConfigError(f"alpha: must be > 0 for a dirichlet partition, got {alpha}")
    if cap is not None and cap < 1:
        raise ConfigError(f"samples_per_device: must be >= 1, got {cap}")
    if scheme in FIXED_SIZE_PARTITIONS and cap is not None:
        raise ConfigError(f"samples_per_device: {scheme} gives each device exactly client_data_size; unset it")


def _dirichlet_parts(labels: np.ndarray, num_devices: int, alpha: float, rng: np.random.Generator) -> list[np.ndarray]:
    buckets: list[list[np.ndarray]] = [[] for _ in range(num_devices)]
    for cls in np.unique(labels):
        members = rng.permutation(np.flatnonzero(labels == cls))
        shares = rng.dirichlet(np.full(num_devices, alpha))
        if not np.all(np.isfinite(shares)) or shares.sum() <= 0:
            # Tiny alphas can underflow every share; give the class to one device instead.
            shares = np.zeros(num_devices)
            shares[rng.integers(num_devices)] = 1.0
        cuts = np.floor(np.cumsum(shares)[:-1] * len(members)).astype(np.int64)
        cuts = np.clip(cuts, 0, len(members))
        for device, chunk in enumerate(np.split(members, cuts)):
            buckets[device].append(chunk)
    # Shuffled per device so that a cap keeps a mix of that device's classes.
    return [rng.permutation(np.concatenate(chunks)) for chunks in buckets]


def _fill_empty(parts: list[np.ndarray]) -> None:
    # With at least as many samples as devices, the largest device then has >= 2.
    for device in range(len(parts)):
        if len(parts[device]) == 0:
            donor = max(range(len(parts)), key=lambda d: len(parts[d]))
            parts[device] = parts[donor][-1:]
            parts[donor] = parts[donor][:-1]


def partition_indices(
    labels: np.ndarray,
    num_devices: int,
    scheme: str,
    alpha: float,
    seed: int,
    cap: int | None,
) -> tuple[np.ndarray, ...]:
    """Disjoint, non-empty index sets, one per device, fixed by seed."""
    _check_partition_args(num_devices, scheme, alpha, cap)
    if scheme in FIXED_SIZE_PARTITIONS:
        raise ConfigError(f"partition: {scheme} shards overlap; fixed_shards.py and device_shards.py draw them")
    labels = np.asarray(labels).reshape(-1)
    if len(labels) < num_devices:
        raise DataError(f"partition: {len(labels)} samples cannot give each of {num_devices} devices one")
    rng = np.random.default_rng(seed)
    if scheme == "iid":
        parts = list(np.array_split(rng.permutation(len(labels)), num_devices))
    else:
        parts = _dirichlet_parts(labels, num_devices, alpha, rng)
    _fill_empty(parts)
    if cap is not None:
        parts = [part[:cap] for part in parts]
    return tuple(np.ascontiguousarray(part, dtype=np.int64) for part in parts)


def _stratified_split(labels: np.ndarray, test_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    # Its own stream, so the split is not correlated with partition_indices(seed).
    rng = np.random.default_rng([seed, 1])
    train: list[np.ndarray] = []
    test: list[np.ndarray] = []
    for cls in np.unique(labels):
        members = rng.permutation(np.flatnonzero(labels == cls))
        held_out = int(round(len(members) * test_fraction))
        test.append(members[:held_out])
        train.append(members[held_out:])
    return np.sort(np.concatenate(train)), np.sort(np.concatenate(test))


def _digits_arrays() -> tuple[np.ndarray, np.ndarray]:
    """The digits' 8x8 images (float64) and labels, as scikit-learn's load_digits gives them.

    Read straight from the file scikit-learn ships: importing scikit-learn costs most of a
    second per process (scipy with it), reading the file some milliseconds.
    """
    import gzip
    from importlib.util import find_spec

    spec = find_spec("sklearn")  # finds the package without running its __init__
    folders = list(spec.submodule_search_locations or []) if spec is not None else []
    found = [Path(folder) / "datasets" / "data" / "digits.csv.gz" for folder in folders]
    found = [path for path in found if path.is_file()]
    if not found:
        from sklearn.datasets import load_digits

        bunch = load_digits()
        return bunch.images, bunch.target
    with gzip.open(found[0], mode="rt", encoding="utf-8") as text:
        table = np.loadtxt(text, delimiter=",")
    return table[:, :-1].reshape(-1, 8, 8), table[:, -1].astype(int, copy=False)


def _digits(seed: int) -> tuple[TensorData, TensorData]:
    images, target = _digits_arrays()  # bundled with scikit-learn, no download
    x = torch.from_numpy((images / 16.0).astype(np.float32)).unsqueeze(1)
    y = torch.from_numpy(target.astype(np.int64))
    train_idx, test_idx = _stratified_split(target, _DIGITS_TEST_FRACTION, seed)

    def take(idx: np.ndarray) -> TensorData:
        index = torch.from_numpy(idx)
        return TensorData(x[index].contiguous(), y[index].contiguous())

    return take(train_idx), take(test_idx)


@dataclass(frozen=True)
class _CifarFormat:
    """What differs between torchvision's CIFAR-10 and CIFAR-100 folders, and how fedqueue normalises each."""

    name: str  # as errors name it
    folder: str
    num_classes: int
    mean: tuple[float, float, float]
    std: tuple[float, float, float]


_CIFAR10 = _CifarFormat("CIFAR-10", "cifar-10-batches-py", NUM_CLASSES, CIFAR10_MEAN, CIFAR10_STD)
_CIFAR100 = _CifarFormat("CIFAR-100", "cifar-100-python", CIFAR100_CLASSES, CIFAR100_MEAN, CIFAR100_STD)


@functools.lru_cache(maxsize=2)
def _unchecked_cifar(folder: str) -> type:
    from torchvision.datasets import CIFAR10, CIFAR100

    base = CIFAR10 if folder == _CIFAR10.folder else CIFAR100

    class Unchecked(base):  # type: ignore[valid-type,misc]  # one of two torchvision classes, chosen above
        # torchvision's reader minus md5 sums, which fixtures and re-packed copies cannot match.
        train_list = [[name, None] for name, _ in base.train_list]
        test_list = [[name, None] for name, _ in base.test_list]
        meta = {**base.meta, "md5": None}

    return Unchecked


def _read_cifar(root: str, train: bool, form: _CifarFormat = _CIFAR10) -> TensorData:
    try:
        dataset: Any = _unchecked_cifar(form.folder)(root, train=train, download=False)
    except (
        RuntimeError,
        OSError,
        EOFError,
        KeyError,
        IndexError,
        TypeError,
        ValueError,
        pickle.UnpicklingError,
    ) as err:
        # torchvision's own message suggests download=True, which fedqueue never does.
        raise DataError(f"dataset root {root!r}: {form.folder} files missing or unreadable") from err
    # One bulk conversion instead of torchvision's per-item PIL transforms.
    pixels = torch.from_numpy(np.ascontiguousarray(dataset.data))  # N, H, W, C uint8
    x = pixels.permute(0, 3, 1, 2).contiguous().to(torch.float32).div_(255.0)
    x.sub_(torch.tensor(form.mean).view(1, 3, 1, 1))
    x.div_(torch.tensor(form.std).view(1, 3, 1, 1))
    y = torch.tensor(list(dataset.targets), dtype=torch.int64)
    if len(y) and (int(y.min()) < 0 or int(y.max()) >= form.num_classes):
        raise DataError(f"dataset root {root!r}: {form.name} labels outside 0..{form.num_classes - 1}")
    return TensorData(x, y)


def _cifar(root: str | None, form: _CifarFormat = _CIFAR10) -> tuple[TensorData, TensorData]:
    if root is None or not Path(root).is_dir():
        raise DataError(f"dataset root {root!r} does not exist")
    return _read_cifar(str(root), True, form), _read_cifar(str(root), False, form)


def blank_pixel(dataset: str) -> tuple[float, ...]:
    """A black pixel per channel as the model sees it (what torchvision's zero padding becomes after
    normalisation); empty where the dataset is not normalised by fedqueue (zero in every channel)."""
    form = {"cifar10": _CIFAR10, "cifar100": _CIFAR100}.get(dataset)
    return () if form is None else tuple(-m / s for m, s in zip(form.mean, form.std, strict=True))


def _synthetic(seed: int, train_count: int) -> tuple[TensorData, TensorData]:
    generator = torch.Generator(device="cpu").manual_seed(seed)
    # Smooth class prototypes (8x8 upsampled) give convolutions spatial structure to find.
    coarse = torch.randn(NUM_CLASSES, 3, 8, 8, generator=generator)
    prototypes = F.interpolate(coarse, size=(32, 32), mode="bilinear", align_corners=False)

    def draw(count: int) -> TensorData:
        order = torch.randperm(count, generator=generator)
        y = (torch.arange(count, dtype=torch.int64) % NUM_CLASSES)[order]
        noise = torch.randn(count, 3, 32, 32, generator=generator)
        x = noise.add_(prototypes[y], alpha=_SYNTHETIC_SIGNAL)
        return TensorData(x.contiguous(), y.contiguous())

    return draw(train_count), draw(_SYNTHETIC_TEST)


def digits(request: DatasetRequest) -> LoadedDataset:
    """Built-in: the UCI handwritten digits bundled with scikit-learn (8x8, 10 classes)."""
    train, test = _digits(request.seed)
    return LoadedDataset(train=train, test=test, num_classes=NUM_CLASSES)


def cifar10(request: DatasetRequest) -> LoadedDataset:
    """Built-in: CIFAR-10 from `request.root`, in torchvision's folder layout; never downloads."""
    train, test = _cifar(request.root)
    return LoadedDataset(train=train, test=test, num_classes=NUM_CLASSES)


def cifar100(request: DatasetRequest) -> LoadedDataset:
    """Built-in: CIFAR-100 (fine labels) from `request.root`, in torchvision's folder layout; never downloads."""
    train, test = _cifar(request.root, _CIFAR100)
    return LoadedDataset(train=train, test=test, num_classes=CIFAR100_CLASSES)


def synthetic(request: DatasetRequest) -> LoadedDataset:
    """Built-in: CIFAR-shaped, learnable data generated from the seed (for benchmarks)."""
    wanted = (request.samples_per_device or 0) * request.num_devices
    train, test = _synthetic(request.seed, max(_SYNTHETIC_TRAIN, wanted))
    return LoadedDataset(train=train, test=test, num_classes=NUM_CLASSES)


def _validate(spec: DataSpec) -> None:
    if not is_valid_name("dataset", spec.dataset):
        raise ConfigError(f"dataset: unknown dataset {spec.dataset!r} (choose from {describe_choices('dataset')})")
    if spec.seed < 0:
        raise ConfigError(f"seed: must be >= 0, got {spec.seed}")
    _check_partition_args(spec.num_devices, spec.partition, spec.alpha, spec.samples_per_device)


def _build(spec: DataSpec) -> FederatedData:
    _validate(spec)
    loader = resolve("dataset", spec.dataset)
    request = DatasetRequest(
        root=spec.root,
        seed=spec.seed,
        num_devices=spec.num_devices,
        samples_per_device=spec.samples_per_device,
        options=spec.options,
    )
    loaded = loader(request)
    if not isinstance(loaded, LoadedDataset):
        raise DataError(f"dataset: {spec.dataset!r} returned {type(loaded).__name__}, not a LoadedDataset")
    train = loaded.train
    server, parts = _split(spec, loaded)
    if isinstance(parts, tuple):
        for part in parts:
            part.setflags(write=False)  # shared through the cache
    return FederatedData(
        train=train,
        test=loaded.test,
        partitions=parts,
        num_classes=loaded.num_classes,
        input_shape=tuple(train.x.shape[1:]),
        server=server,
    )


def _split(spec: DataSpec, loaded: LoadedDataset) -> tuple[np.ndarray | None, Sequence[np.ndarray]]:
    """(the server's held-out indices or None, each device's indices) into the training set."""
    train = loaded.train
    if loaded.partitions is None and spec.partition in FIXED_SIZE_PARTITIONS:
        return _fixed_shards(spec, train, loaded.num_classes)
    server, pool = _server_split(spec, len(train))
    if loaded.partitions is None:
        parts = partition_indices(
            train.y.numpy()[pool],
            spec.num_devices,
            spec.partition,
            spec.alpha,
            spec.seed,
            spec.samples_per_device,
        )
        return server, tuple(np.ascontiguousarray(pool[part]) for part in parts)
    if server is not None:
        raise ConfigError(f"kd_split: the dataset {spec.dataset!r} brings its own partitions; hold nothing out of it")
    return None, _given_partitions(spec, loaded.partitions, len(train))


def _fixed_shards(
    spec: DataSpec, train: TensorData, num_classes: int
) -> tuple[np.ndarray | None, FixedShards | DeviceShards]:
    """FedRevive's split and shards: the server holds the kd part (if it holds anything), val goes unused.
    dirichlet_fixed's shards are dealt when a device's is first read, up to that device; _per_device's are
    each drawn alone when read."""
    if spec.client_data_size is None:
        raise ConfigError(f'client_data_size: required with partition = "{spec.partition}"')
    pool, _, kd = fixed_split(len(train), spec.val_fraction, spec.kd_fraction)
    labels = train.y.numpy()[pool]
    size, alpha = spec.client_data_size, spec.alpha
    rule = FixedShards if spec.partition == "dirichlet_fixed" else DeviceShards
    shards = rule(labels, spec.num_devices, size, alpha, num_classes, spec.seed, into=pool)
    server = None
    if spec.server_fraction > 0:
        if len(kd) == 0:
            raise ConfigError(f"kd_split: {spec.kd_fraction} of {len(train)} training samples holds out none")
        server = np.sort(kd)
        server.setflags(write=False)
    return server, shards


def partition_sizes(data: FederatedData) -> np.ndarray:
    """Every device's sample count; fixed shards are not dealt for it."""
    if isinstance(data.partitions, FixedShards | DeviceShards):
        return data.partitions.sizes()
    return np.fromiter((len(part) for part in data.partitions), dtype=np.int64, count=len(data.partitions))


SERVER_SPLIT_STREAM = 0x5E4D  # keeps the held-out draw apart from the partition's


def _server_split(spec: DataSpec, size: int) -> tuple[np.ndarray | None, np.ndarray]:
    """The server's held-out indices (None when it holds none) and the rest, which the devices share."""
    everything = np.arange(size, dtype=np.int64)
    if spec.server_fraction <= 0:
        return None, everything
    count = int(round(spec.server_fraction * size))
    if not 0 < count < size:
        raise ConfigError(f"kd_split: {spec.server_fraction} of {size} training samples holds out {count}")
    rng = np.random.default_rng([spec.seed, SERVER_SPLIT_STREAM])
    held = np.sort(rng.choice(size, size=count, replace=False))
    held.setflags(write=False)
    return held, np.setdiff1d(everything, held, assume_unique=True)


def _given_partitions(
    spec: DataSpec, partitions: Sequence[Sequence[int] | np.ndarray], train_size: int
) -> tuple[np.ndarray, ...]:
    """A loader's own split (natural per-user data), checked and capped like fedqueue's."""
    if len(partitions) != spec.num_devices:
        raise DataError(
            f"num_devices: the dataset {spec.dataset!r} has {len(partitions)} natural partitions,"
            f" but num_devices = {spec.num_devices}"
        )
    parts = []
    for device, indices in enumerate(partitions):
        part = np.asarray(indices, dtype=np.int64).reshape(-1)
        if len(part) == 0 or part.min() < 0 or part.max() >= train_size:
            raise DataError(f"dataset: partition {device} is empty or indexes outside the training set")
        if spec.samples_per_device is not None:
            part = part[: spec.samples_per_device]
        parts.append(np.ascontiguousarray(part))
    return tuple(parts)


@functools.lru_cache(maxsize=4)
def _load_cached(spec: DataSpec) -> FederatedData:
    return _build(spec)


_LOAD_LOCK = threading.Lock()


def load_federated(spec: DataSpec) -> FederatedData:
    """The dataset and its partition for spec, loaded once per process.

    The result is shared between callers: treat its tensors as read-only.
    """
    # Worker threads that miss together would each build a copy; the lock makes them wait for one.
    with _LOAD_LOCK:
        return _load_cached(spec)


@functools.lru_cache(maxsize=128)
def device_data(spec: DataSpec, device: int) -> TensorData:
    """Device `device`'s training samples as contiguous tensors (cached; read-only)."""
    federated = load_federated(spec)
    if not 0 <= device < len(federated.partitions):
        raise IndexError(f"device {device} out of range for {len(federated.partitions)} devices")
    index = torch.from_numpy(federated.partitions[device].astype(np.int64))
    return TensorData(
        federated.train.x.index_select(0, index).contiguous(),
        federated.train.y.index_select(0, index).contiguous(),
    )


def clear_caches() -> None:
    """Drop every cached dataset and device slice (tests, or to free memory)."""
    device_data.cache_clear()
    _load_cached.cache_clear()
