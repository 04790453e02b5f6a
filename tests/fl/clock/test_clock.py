"""The virtual clock: trip times from the seed alone, speed classes by share, delays never negative."""

from __future__ import annotations

import numpy as np
import pytest

from fedqueue.fl.clock.trips import Delay, DeviceClock, DeviceSpeed, samples_processed


def test_fixed_speeds_give_exact_trip_times() -> None:
    clock = DeviceClock(0, DeviceSpeed(mean=(0.5,), std=(0.0,)), Delay(mean=2.0, std=0.0), work=[10, 40])
    trip = clock.trip(round_index=3, device=1)
    assert (trip.download, trip.train, trip.upload) == (2.0, 20.0, 2.0)
    assert clock.trip_seconds(3, 0) == 2.0 + 5.0 + 2.0


def test_same_seed_same_times_and_each_trip_its_own_draw() -> None:
    speed, delay = DeviceSpeed(mean=(0.01, 0.05), std=(0.002, 0.01)), Delay(mean=1.0, std=0.3)
    work = [100] * 50
    first, second = DeviceClock(4, speed, delay, work), DeviceClock(4, speed, delay, work)
    times = [first.trip_seconds(r, d) for r in (1, 2) for d in range(50)]
    assert times == [second.trip_seconds(r, d) for r in (1, 2) for d in range(50)]
    # Asked in another order, or after other questions, a trip takes the same time.
    assert second.trip_seconds(2, 49) == times[-1]
    assert times[:50] != times[50:]
    assert times != [DeviceClock(5, speed, delay, work).trip_seconds(r, d) for r in (1, 2) for d in range(50)]


def test_classes_follow_their_shares() -> None:
    clock = DeviceClock(1, DeviceSpeed(mean=(1.0, 2.0, 4.0), std=(0, 0, 0), share=(0.7, 0.2, 0.1)), Delay(), [1] * 5000)
    counts = np.bincount([clock.speed_class(d) for d in range(5000)], minlength=3) / 5000
    assert counts == pytest.approx([0.7, 0.2, 0.1], abs=0.03)
    # A device keeps its class from trip to trip: its training time is its class's (std 0).
    assert {clock.trip(r, 17).train for r in range(1, 6)} == {[1.0, 2.0, 4.0][clock.speed_class(17)]}


def test_normal_draws_are_cut_at_zero() -> None:
    clock = DeviceClock(2, DeviceSpeed(mean=(0.001,), std=(1.0,)), Delay(mean=0.0, std=5.0), [10] * 200)
    trips = [clock.trip(1, d) for d in range(200)]
    assert min(min(t.download, t.train, t.upload) for t in trips) == 0.0
    assert all(t.total >= 0 for t in trips)


def test_samples_processed() -> None:
    assert samples_processed(50, batch_size=8, local_iters=5, local_epochs=None) == 40
    assert samples_processed(3, batch_size=8, local_iters=5, local_epochs=None) == 15
    assert samples_processed(50, batch_size=8, local_iters=None, local_epochs=2) == 100
    assert samples_processed(50, batch_size=8, local_iters=None, local_epochs=None) == 50
