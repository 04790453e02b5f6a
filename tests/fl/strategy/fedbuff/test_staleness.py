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


# FedRevive's AFL-DW (afl_dw.json: cosine beta, adaptive_beta_factor = s_max = 75): w = 1 - beta(s).
AFL_DW = [(0, 1.0), (10, 0.989074), (25, 0.933013), (50, 0.75), (75, 0.5), (100, 0.25), (125, 0.066987)]
AFL_DW += [(150, 0.0), (151, 0.0), (1000, 0.0)]
# FLARE's edge manager: 1 / (1 + sqrt(s + 1)), s counted at arrival as fedqueue counts it.
FLARE = [(0, 0.5), (1, 0.414214), (2, 0.366025), (3, 0.333333), (8, 0.25), (24, 0.166667)]


@pytest.mark.parametrize(("staleness", "expected"), AFL_DW)
def test_afl_dw_equals_fedrevive_hand_values(staleness: int, expected: float) -> None:
    assert staleness_weight("afl_dw", staleness, s_max=75) == pytest.approx(expected, abs=5e-7)


@pytest.mark.parametrize(("staleness", "expected"), FLARE)
def test_flare_sqrt_equals_flare_hand_values(staleness: int, expected: float) -> None:
    assert staleness_weight("flare_sqrt", staleness) == pytest.approx(expected, abs=5e-7)
    # fedqueue's own `sqrt` is the same formula one version later: unchanged for existing configs.
    assert staleness_weight("flare_sqrt", staleness) == staleness_weight("sqrt", staleness + 1)


def test_afl_dw_follows_its_s_max() -> None:
    assert staleness_weight("afl_dw", 2, s_max=2) == pytest.approx(0.5)
    assert staleness_weight("afl_dw", 4, s_max=2) == pytest.approx(0.0, abs=1e-15)
    assert staleness_weight("afl_dw", 5, s_max=2) == 0.0
    weights = [staleness_weight("afl_dw", s, s_max=2) for s in range(8)]
    assert weights == sorted(weights, reverse=True) and weights[0] == 1.0


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
