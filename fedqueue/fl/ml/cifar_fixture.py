"""Small CIFAR-10 look-alike folders on disk, for tests and benchmarks without the download."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np

_LABEL_NAMES = [
    "airplane",
    "automobile",
    "bird",
    "cat",
    "deer",
    "dog",
    "frog",
    "horse",
    "ship",
    "truck",
]
_TRAIN_BATCHES = 5
_PIXELS = 3 * 32 * 32


def _images(rng: np.random.Generator, prototypes: np.ndarray, labels: np.ndarray) -> np.ndarray:
    # A fixed pattern per class plus noise, so models can learn something from it.
    noise = rng.integers(0, 256, size=(len(labels), _PIXELS), dtype=np.uint16)
    images: np.ndarray = ((prototypes[labels] + noise) // 2).astype(np.uint8)
    return images


def _balanced_labels(rng: np.random.Generator, count: int) -> np.ndarray:
    return rng.permutation(np.arange(count, dtype=np.int64) % 10)


def _write_pickle(path: Path, payload: dict[str, object]) -> None:
    # Str keys: torchvision unpickles the real (Python 2) files with latin1, which yields str keys.
    with path.open("wb") as handle:
        pickle.dump(payload, handle, protocol=2)


def _write_batch(path: Path, label: str, data: np.ndarray, labels: np.ndarray) -> None:
    _write_pickle(
        path,
        {
            "batch_label": label,
            "labels": [int(v) for v in labels],
            "data": np.ascontiguousarray(data, dtype=np.uint8),
            "filenames": [f"{path.name}_{i:05d}.png" for i in range(len(labels))],
        },
    )


def write_cifar_batches(root: str | Path, train_samples: int, test_samples: int, seed: int = 0) -> Path:
    """Write `root/cifar-10-batches-py/` in CIFAR-10's pickle layout and return that folder.

    Pass `root` (not the returned folder) as the dataset root. Training samples are
    spread over data_batch_1..5 in order; the md5 sums cannot match the real files.
    """
    if train_samples < 0 or test_samples < 0:
        raise ValueError("sample counts must be >= 0")
    folder = Path(root) / "cifar-10-batches-py"
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    # Shared by train and test so that what is learnt on one carries over to the other.
    prototypes = rng.integers(0, 256, size=(10, _PIXELS), dtype=np.uint16)

    train_labels = _balanced_labels(rng, train_samples)
    train_data = _images(rng, prototypes, train_labels)
    chunks = np.array_split(np.arange(train_samples), _TRAIN_BATCHES)
    for number, chunk in enumerate(chunks, start=1):
        _write_batch(
            folder / f"data_batch_{number}",
            f"training batch {number} of {_TRAIN_BATCHES}",
            train_data[chunk].reshape(len(chunk), _PIXELS),
            train_labels[chunk],
        )

    test_labels = _balanced_labels(rng, test_samples)
    test_data = _images(rng, prototypes, test_labels)
    _write_batch(folder / "test_batch", "testing batch 1 of 1", test_data, test_labels)

    _write_pickle(
        folder / "batches.meta",
        {
            "label_names": list(_LABEL_NAMES),
            "num_cases_per_batch": max((len(c) for c in chunks), default=0),
            "num_vis": _PIXELS,
        },
    )
    return folder


def write_cifar100_files(root: str | Path, train_samples: int, test_samples: int, seed: int = 0) -> Path:
    """Write `root/cifar-100-python/` (train, test, meta) in CIFAR-100's pickle layout and return that folder.

    Pass `root` as the dataset root; labels cycle through the 100 fine classes.
    """
    if train_samples < 0 or test_samples < 0:
        raise ValueError("sample counts must be >= 0")
    folder = Path(root) / "cifar-100-python"
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    prototypes = rng.integers(0, 256, size=(100, _PIXELS), dtype=np.uint16)
    for name, count in (("train", train_samples), ("test", test_samples)):
        labels = rng.permutation(np.arange(count, dtype=np.int64) % 100)
        _write_pickle(
            folder / name,
            {
                "filenames": [f"{name}_{i:05d}.png" for i in range(count)],
                "batch_label": f"{name} batch",
                "fine_labels": [int(v) for v in labels],
                "coarse_labels": [int(v) // 5 for v in labels],
                "data": np.ascontiguousarray(_images(rng, prototypes, labels), dtype=np.uint8),
            },
        )
    _write_pickle(
        folder / "meta",
        {
            "fine_label_names": [f"class_{i}" for i in range(100)],
            "coarse_label_names": [f"group_{i}" for i in range(20)],
        },
    )
    return folder
