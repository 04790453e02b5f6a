"""Staleness weights and cut-offs: pure functions checked against values worked out by hand."""

from __future__ import annotations

import math

import pytest

from fedqueue.fl.strategy.fedbuff.staleness import is_too_stale, staleness_weight


@pytest.mark.parametrize(
    ("rule", "staleness", "exponent", "expected"),
    [
        ("none", 0, 0.5, 1.0),
        ("none", 7, 0.5, 1.0),
        ("polynomial", 0, 0.5, 1.0),
        ("polynomial", 3, 0.5, 0.5),  # (1 + 3) ** -0.5
        ("polynomial", 1, 1.0, 0.5),  # (1 + 1) ** -1
        ("polynomial", 8, 1 / 3, 1 / 9 ** (1 / 3)),  # 9 ** (-1/3)
        ("sqrt", 0, 0.5, 1.0),  # FLARE's 1 / (1 + sqrt(s)) is 1 for a fresh update here
        ("sqrt", 4, 0.5, 1 / 3),
        ("sqrt", 9, 0.5, 0.25),
    ],
)
def test_weights_equal_hand_computed_values(rule: str, staleness: int, exponent: float, expected: float) -> None:
    assert math.isclose(staleness_weight(rule, staleness, exponent), expected, rel_tol=1e-12)


def test_weights_fall_with_staleness() -> None:
    for rule in ("polynomial", "sqrt"):
        weights = [staleness_weight(rule, s) for s in range(10)]
        assert weights == sorted(weights, reverse=True)
        assert weights[0] == 1.0 and weights[-1] < 0.5


def test_bad_input_is_refused() -> None:
    with pytest.raises(ValueError, match="staleness"):
        staleness_weight("sqrt", -1)
    with pytest.raises(ValueError, match="unknown staleness weighting 'linear'"):
        staleness_weight("linear", 1)


def test_cut_off_drops_only_older_updates() -> None:
    assert not is_too_stale(5, None)
    assert not is_too_stale(2, 2)
    assert is_too_stale(3, 2)
    assert is_too_stale(1, 0)
    assert not is_too_stale(0, 0)
