from __future__ import annotations

import numpy as np
import pytest

from fedqueue.errors import ConfigError, DataError
from fedqueue.fl.ml.data import partition_indices


def _labels(count: int = 1000, classes: int = 10) -> np.ndarray:
    return np.random.default_rng(0).integers(0, classes, size=count)


def _assert_disjoint_non_empty(parts: tuple[np.ndarray, ...], total: int) -> None:
    assert all(len(part) >= 1 for part in parts)
    joined = np.concatenate(parts)
    assert len(np.unique(joined)) == len(joined)
    assert joined.min() >= 0 and joined.max() < total


@pytest.mark.parametrize("scheme", ["iid", "dirichlet"])
def test_deterministic_for_a_seed_and_seed_matters(scheme: str) -> None:
    labels = _labels()
    first = partition_indices(labels, 8, scheme, 0.5, 3, None)
    again = partition_indices(labels, 8, scheme, 0.5, 3, None)
    other = partition_indices(labels, 8, scheme, 0.5, 4, None)
    assert len(first) == 8
    assert all(np.array_equal(a, b) for a, b in zip(first, again, strict=True))
    assert not all(np.array_equal(a, b) for a, b in zip(first, other, strict=True))


def test_iid_covers_everything_in_near_equal_parts() -> None:
    labels = _labels(1003)
    parts = partition_indices(labels, 10, "iid", 0.5, 0, None)
    _assert_disjoint_non_empty(parts, len(labels))
    assert sorted(np.concatenate(parts).tolist()) == list(range(len(labels)))
    sizes = [len(part) for part in parts]
    assert max(sizes) - min(sizes) <= 1


def test_dirichlet_covers_everything_and_is_skewed() -> None:
    labels = _labels(2000)
    parts = partition_indices(labels, 10, "dirichlet", 0.1, 0, None)
    _assert_disjoint_non_empty(parts, len(labels))
    assert sorted(np.concatenate(parts).tolist()) == list(range(len(labels)))

    def top_class_share(split: tuple[np.ndarray, ...]) -> float:
        return float(np.mean([np.bincount(labels[p], minlength=10).max() / len(p) for p in split]))

    iid = partition_indices(labels, 10, "iid", 0.1, 0, None)
    # A small alpha concentrates each device on few classes; iid stays near 1/10.
    assert top_class_share(parts) > 0.4 > top_class_share(iid)


def test_dirichlet_fills_devices_that_drew_nothing() -> None:
    # With alpha this small each class lands on about one device, so most would be empty.
    labels = _labels(300)
    parts = partition_indices(labels, 30, "dirichlet", 0.01, 1, None)
    assert len(parts) == 30
    _assert_disjoint_non_empty(parts, len(labels))


@pytest.mark.parametrize("scheme", ["iid", "dirichlet"])
def test_cap_truncates_each_device(scheme: str) -> None:
    labels = _labels()
    uncapped = partition_indices(labels, 4, scheme, 1.0, 5, None)
    capped = partition_indices(labels, 4, scheme, 1.0, 5, 30)
    assert max(len(part) for part in uncapped) > 30
    assert all(1 <= len(part) <= 30 for part in capped)
    _assert_disjoint_non_empty(capped, len(labels))


def test_bad_arguments() -> None:
    labels = _labels(5)
    with pytest.raises(DataError):
        partition_indices(labels, 6, "iid", 0.5, 0, None)
    with pytest.raises(ConfigError, match="partition"):
        partition_indices(labels, 2, "shards", 0.5, 0, None)
    with pytest.raises(ConfigError, match="alpha"):
        partition_indices(labels, 2, "dirichlet", 0.0, 0, None)
