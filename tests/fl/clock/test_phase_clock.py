"""FedRevive's per-phase clock and FLARE's per-trip preset: distributions, per-device means, seeds.

Every number here comes from a fixed seed, so the tolerances are margins around one draw that is
the same on every machine, not odds of a flaky failure.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from fedqueue.fl.clock.delays import FEDREVIVE_DELAYS, PHASE_KEYS, PhaseDelay, phase_delay
from fedqueue.fl.clock.phases import FlareClock, PhaseClock, device_means, draw
from fedqueue.fl.clock.trips import Delay, DeviceSpeed
from fedqueue.fl.config import RunConfig

DRAWS = 100_000
NONE = PhaseDelay("constant", (1.0,), (0.0,), 0.0)  # a phase that takes no time


def quartiles(values: np.ndarray) -> list[float]:
    return [float(q) for q in np.quantile(values, [0.25, 0.5, 0.75])]


def only(phase: int, delay: PhaseDelay) -> list[PhaseDelay]:
    """A trip whose only phase that takes time is `phase` (0 download, 1 training, 2 upload)."""
    return [delay if index == phase else NONE for index in range(3)]


# Each case with the margin its quartiles get: about five standard errors of a quartile of 100,000
# draws (sqrt(p (1 - p) / n) / density there); a mean gets 2 %, over four standard errors.
@pytest.mark.parametrize(
    ("kind", "mean", "std", "expected_mean", "expected_quartiles", "margin"),
    [
        # Exp(m): quartiles m ln(4/3), m ln 2, m ln 4; std unused.
        ("exponential", 1.3, 0.2, 1.3, [1.3 * math.log(4 / 3), 1.3 * math.log(2), 1.3 * math.log(4)], 0.03),
        # U(m - std, m + std): FedRevive's upload, std the half-width.
        ("uniform", 0.15, 0.02, 0.15, [0.14, 0.15, 0.16], 3e-4),
        # The lower end is clipped at 0: U(0, 0.03), whose mean is not m.
        ("uniform", 0.01, 0.02, 0.015, [0.0075, 0.015, 0.0225], 3e-4),
        # normal(m, std): quartiles m -/+ 0.674490 std (the clip at 0 is 5 std away).
        ("normal", 1.0, 0.2, 1.0, [1.0 - 0.674490 * 0.2, 1.0, 1.0 + 0.674490 * 0.2], 0.005),
        # std = mean: 15.87 % of the draws are clipped to 0 and the mean is Phi(1) + phi(1) = 1.083316.
        ("normal", 1.0, 1.0, 1.083316, [1.0 - 0.674490, 1.0, 1.0 + 0.674490], 0.02),
    ],
)
def test_each_type_matches_its_mean_and_quartiles(
    kind: str, mean: float, std: float, expected_mean: float, expected_quartiles: list[float], margin: float
) -> None:
    values = np.asarray(draw(kind, mean, std, np.random.default_rng(12345), size=DRAWS))
    assert values.min() >= 0
    assert values.mean() == pytest.approx(expected_mean, rel=0.02)
    assert quartiles(values) == pytest.approx(expected_quartiles, abs=margin)
    if kind == "normal" and std == mean:
        assert np.mean(values == 0) == pytest.approx(0.158655, abs=0.006)


def test_constant_is_its_mean() -> None:
    assert set(np.asarray(draw("constant", 0.1, 0.2, np.random.default_rng(0), size=DRAWS)).tolist()) == {0.1}
    assert draw("constant", 0.1, 0.2, np.random.default_rng(0)) == 0.1


@pytest.mark.parametrize("phase", [0, 1, 2])
def test_the_clock_draws_each_phase_from_its_type(phase: int) -> None:
    """The clock's trips follow the same law as the draws above (fewer of them: a stream per trip)."""
    clock = PhaseClock(3, only(phase, PhaseDelay("exponential", (1.0,), (2.0,), 0.0)), num_devices=200)
    times = [clock.trip(r, d) for r in range(1, 101) for d in range(200)]
    spent = np.array([[t.download, t.train, t.upload][phase] for t in times])
    assert np.array([t.total for t in times]) == pytest.approx(spent)
    assert spent.mean() == pytest.approx(2.0, rel=0.03)
    assert quartiles(spent) == pytest.approx([2 * math.log(4 / 3), 2 * math.log(2), 2 * math.log(4)], rel=0.04)


def test_a_device_draws_its_mean_once() -> None:
    mixture = PhaseDelay("constant", (0.25, 0.5, 0.25), (1.0, 1.3, 1.6), 0.0)
    clock = PhaseClock(5, only(1, mixture), num_devices=20_000)
    means = np.array([clock.mean(1, d) for d in range(20_000)])
    shares = [float(np.mean(means == m)) for m in (1.0, 1.3, 1.6)]
    assert shares == pytest.approx([0.25, 0.5, 0.25], abs=0.01)
    # A constant phase is the device's mean on every trip, in every round.
    for device in (0, 7, 19_999):
        assert {clock.trip(r, device).train for r in range(1, 30)} == {means[device]}
    # Device d's mean does not depend on how many devices the run has.
    assert [PhaseClock(5, only(1, mixture), num_devices=10).mean(1, d) for d in range(10)] == means[:10].tolist()


def test_means_follow_the_mixture_as_fedrevive_picks_them() -> None:
    """The first mean whose cumulative share reaches the draw; shares need not add up to 1."""
    phase = phase_delay("upload_delay", {"type": "uniform", "mean_distribution": [[1, 0.15], [3, 0.25]], "std": 0.02})
    assert phase.shares == (0.25, 0.75)
    rng = np.random.default_rng(9)
    draws = np.random.default_rng(9).random(1000)
    expected = np.where(draws <= 0.25, 0.15, 0.25)
    assert device_means(phase, rng, 1000).tolist() == expected.tolist()


def test_trip_times_come_from_the_seed_alone() -> None:
    phases = [phase_delay(key, {}) for key in PHASE_KEYS]  # FedRevive's schedule
    first, second = PhaseClock(10, phases, 100), PhaseClock(10, phases, 100)
    times = [first.trip_seconds(r, d) for r in (1, 2) for d in range(100)]
    assert second.trip_seconds(2, 99) == times[-1]  # asked first, out of order: the same time
    assert times == [second.trip_seconds(r, d) for r in (1, 2) for d in range(100)]
    assert times[:100] != times[100:]  # each trip its own draw
    assert times != [PhaseClock(11, phases, 100).trip_seconds(r, d) for r in (1, 2) for d in range(100)]
    # Changing the upload's table leaves the other phases' draws as they were.
    slower = [*phases[:2], phase_delay("upload_delay", {"type": "normal", "mean_distribution": [[1, 3.0]]})]
    assert [PhaseClock(10, slower, 100).trip(1, d).train for d in range(100)] == [
        first.trip(1, d).train for d in range(100)
    ]


def test_fedrevive_schedule_by_default() -> None:
    """clock = "fedrevive" with no tables: their trip of 0.1 + Exp(1.0 | 1.3 | 1.6) + U(0.15 | 0.25 +- 0.02)."""
    phases = [phase_delay(key, {}) for key in PHASE_KEYS]
    assert [p.type for p in phases] == ["constant", "exponential", "uniform"]
    assert sum(p.expected_mean for p in phases) == pytest.approx(1.6)
    clock = PhaseClock(10, phases, 200)
    trips = [clock.trip(r, d) for r in range(1, 51) for d in range(200)]
    assert {t.download for t in trips} == {0.1}
    assert all(0.13 <= t.upload <= 0.27 for t in trips)
    assert np.mean([t.total for t in trips]) == pytest.approx(1.6, rel=0.03)
    assert FEDREVIVE_DELAYS["localtrain_delay"]["mean_distribution"] == [[0.25, 1.0], [0.5, 1.3], [0.25, 1.6]]


def run_config(**overrides: Any) -> RunConfig:
    base = {"dataset": "digits", "num_devices": 40, "devices_per_round": 5, "buffer_size": 5, "mode": "fedbuff"}
    return RunConfig.from_dict({**base, **overrides})


def test_training_time_does_not_depend_on_the_data() -> None:
    """With the phase clock a trip's time is the same whatever the devices hold or process."""
    from fedqueue.fl.ml.data import load_federated
    from fedqueue.fl.setup import data_spec, device_clock

    small = run_config(clock="fedrevive", samples_per_device=10, local_iters=2)
    large = run_config(clock="fedrevive", partition="dirichlet", local_epochs=3)
    times = [device_clock(small, None).trip_seconds(1, d) for d in range(40)]
    assert times == [device_clock(large, load_federated(data_spec(large))).trip_seconds(1, d) for d in range(40)]


def test_flare_preset_is_a_tier_per_device_and_a_sleep_per_trip() -> None:
    """FLARE: max(0, gauss(mean[tier], std[tier])) + max(0, gauss(comm mean, comm std)), tiers with equal odds."""
    exact = FlareClock(1, DeviceSpeed(mean=(100.0, 200.0, 400.0), std=(0.0, 0.0, 0.0)), Delay(5.0, 0.0), 3000)
    tiers = np.bincount([exact.speed_class(d) for d in range(3000)], minlength=3) / 3000
    assert tiers == pytest.approx([1 / 3] * 3, abs=0.03)
    for device in (0, 1, 2999):
        trip = exact.trip(4, device)
        assert (trip.download, trip.train, trip.upload) == (0.0, [100.0, 200.0, 400.0][exact.speed_class(device)], 5.0)
    noisy = FlareClock(1, DeviceSpeed(mean=(100.0, 200.0, 400.0), std=(1.0, 2.0, 4.0)), Delay(5.0, 1.0), 3000)
    gaps = [noisy.trip_seconds(r, d) - exact.trip_seconds(r, d) for r in (1, 2) for d in range(3000)]
    assert np.mean(gaps) == pytest.approx(0.0, abs=0.1) and 1.0 < np.std(gaps) < 3.0
    # Through the config: the same tables, timed per trip (no work in it).
    from fedqueue.fl.setup import device_clock

    config = run_config(clock="flare", device_speed={"mean": [100, 200], "std": [0, 0]})
    clock = device_clock(config, None)
    assert {clock.trip_seconds(1, d) for d in range(40)} == {100.0, 200.0}
