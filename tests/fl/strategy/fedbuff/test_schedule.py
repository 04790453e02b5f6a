"""FedBuff's schedule on a virtual clock: constructed cases whose events are worked out by hand.

Three devices and three slots make every refill draw all the devices it may send, so the
order of events follows from the trip times alone: d0 takes 1 s, d1 2 s, d2 5 s a trip.
"""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from fedqueue.fl.strategy.fedbuff import schedule
from fedqueue.fl.strategy.fedbuff.schedule import (
    Arrival,
    Dispatch,
    NewVersion,
    Outcome,
    Rules,
    ScheduleState,
    Trip,
    pick_free,
)

SECONDS = {0: 1.0, 1: 2.0, 2: 5.0}
RULES = Rules(
    num_devices=3,
    concurrency=3,
    buffer_size=2,
    max_model_version=4,
    max_staleness=None,
    min_refill=1,
    device_reuse=True,
    seed=0,
    staleness_weight="polynomial",
    staleness_exponent=1.0,  # w = 1 / (1 + s)
)


def trip_time(_round: int, device: int, _at: float) -> float:
    return SECONDS[device]


def trained(_trip: Trip) -> Outcome:
    return Outcome(ok=True, samples=10)


def run_all(rules: Rules, outcome_of: schedule.OutcomeOf = trained) -> tuple[ScheduleState, list[schedule.Event]]:
    state, first = schedule.start(rules, trip_time)
    events: list[schedule.Event] = [first] if first is not None else []
    events += schedule.advance(state, rules, trip_time, outcome_of, stop_after_version=False)
    return state, events


def arrivals(events: list[schedule.Event]) -> list[tuple[int, int, str, int, float, int]]:
    return [
        (e.trip.device, e.trip.round_index, e.fate, e.staleness, e.weight, e.version)
        for e in events
        if isinstance(e, Arrival)
    ]


def versions(events: list[schedule.Event]) -> list[tuple[int, float, list[tuple[int, int]]]]:
    return [
        (e.version, e.at, [(a.trip.device, a.trip.round_index) for a in e.folded])
        for e in events
        if isinstance(e, NewVersion)
    ]


def test_stale_update_is_folded_with_its_weight() -> None:
    state, events = run_all(RULES)
    # d2 trains on v0 and arrives at t=5 when v2 is current: staleness 2, weight 1/3. At t=6 d0's
    # trip on v3 (round 4) ties with d1's on v2 (round 3): the lower device goes first.
    assert arrivals(events) == [
        (0, 1, "folded", 0, 1.0, 1),
        (1, 1, "folded", 0, 1.0, 1),
        (0, 2, "folded", 0, 1.0, 2),
        (1, 2, "folded", 0, 1.0, 2),
        (0, 3, "folded", 0, 1.0, 3),
        (2, 1, "folded", 2, pytest.approx(1 / 3), 3),
        (0, 4, "folded", 0, 1.0, 4),
        (1, 3, "folded", 1, 0.5, 4),
    ]
    assert versions(events) == [
        (1, 2.0, [(0, 1), (1, 1)]),
        (2, 4.0, [(0, 2), (1, 2)]),
        (3, 5.0, [(0, 3), (2, 1)]),
        (4, 6.0, [(0, 4), (1, 3)]),
    ]
    assert state.done and (state.folded, state.stale, state.failed) == (8, 0, 0)
    # d2's second trip (on v3, arriving at t=10) is in flight when the last version is made.
    assert [(t.device, t.round_index, t.arrives) for t in state.in_flight] == [(2, 4, 10.0)]


def test_too_stale_update_is_dropped_and_its_device_sent_again() -> None:
    state, events = run_all(replace(RULES, max_staleness=1))
    assert (2, 1, "stale", 2, 0.0, 2) in arrivals(events)
    assert versions(events) == [
        (1, 2.0, [(0, 1), (1, 1)]),
        (2, 4.0, [(0, 2), (1, 2)]),
        (3, 6.0, [(0, 3), (1, 3)]),
        (4, 8.0, [(0, 4), (1, 4)]),
    ]
    # The slot d2 freed at t=5 sends it out again with v2 (round 3), arriving at t=10.
    resent = [e for e in events if isinstance(e, Dispatch) and e.at == 5.0]
    assert [(t.device, t.round_index, t.arrives) for d in resent for t in d.trips] == [(2, 3, 10.0)]
    assert (state.folded, state.stale) == (8, 1)


def test_failed_update_is_counted_and_never_folded() -> None:
    def d1_fails_first(trip: Trip) -> Outcome:
        return Outcome(ok=not (trip.device == 1 and trip.round_index == 1))

    state, events = run_all(RULES, d1_fails_first)
    assert arrivals(events)[1] == (1, 1, "failed", 0, 0.0, 0)
    # d1 trained on v0 already, so its freed slot stays empty: v1 waits for d2's update at t=5.
    assert versions(events)[0] == (1, 5.0, [(0, 1), (2, 1)])
    assert state.failed == 1


def test_advance_stops_at_a_missing_result_and_resumes_from_saved_state() -> None:
    whole_state, whole = run_all(RULES)
    state, first = schedule.start(RULES, trip_time)
    assert first is not None
    events: list[schedule.Event] = [first]
    stored: set[tuple[int, int]] = set()

    def outcome_of(trip: Trip) -> Outcome | None:
        return trained(trip) if (trip.round_index, trip.device) in stored else None

    for _ in range(50):
        if state.done:
            break
        step = schedule.advance(state, RULES, trip_time, outcome_of)
        events += step
        # Saved and loaded as the store does between fold passes.
        state = ScheduleState.from_dict(json.loads(json.dumps(state.to_dict())))
        # The next result "arrives" only now: a worker stores the head trip's update.
        if state.in_flight:
            head = state.in_flight[0]
            stored.add((head.round_index, head.device))
    assert events == whole
    assert state.to_dict() == whole_state.to_dict()


def test_stop_after_version_leaves_later_arrivals_for_the_next_pass() -> None:
    state, _ = schedule.start(RULES, trip_time)
    step = schedule.advance(state, RULES, trip_time, trained)
    assert isinstance(step[-1], Dispatch) and isinstance(step[-2], NewVersion)
    assert state.version == 1 and not state.done


def test_refills_are_seeded_and_never_resend_a_device_on_its_version() -> None:
    rules = replace(RULES, num_devices=30, concurrency=8, buffer_size=4, max_model_version=12, seed=7)

    def varied(round_index: int, device: int, _at: float) -> float:
        return 1.0 + (device * 7 + round_index * 3) % 11

    def play(rules: Rules) -> list[schedule.Event]:
        state, first = schedule.start(rules, varied)
        assert first is not None
        return [first, *schedule.advance(state, rules, varied, trained, stop_after_version=False)]

    events = play(rules)
    assert events == play(rules)
    assert events != play(replace(rules, seed=8))
    sent: set[tuple[int, int]] = set()
    for event in events:
        if isinstance(event, Dispatch):
            for trip in event.trips:
                assert (trip.round_index, trip.device) not in sent
                sent.add((trip.round_index, trip.device))
    made = [e for e in events if isinstance(e, NewVersion)]
    assert [v.version for v in made] == list(range(1, 13))
    assert [v.at for v in made] == sorted(v.at for v in made)


def test_packs_cut_a_refill_in_order() -> None:
    rules = replace(RULES, num_devices=10, concurrency=5, pack_size=2)
    _, first = schedule.start(rules, trip_time=lambda r, d, t: 1.0)
    assert first is not None
    packs = first.packs()
    assert [len(p) for p in packs] == [2, 2, 1]
    assert sorted(d for p in packs for d in p) == sorted(t.device for t in first.trips)


PACKED = replace(RULES, num_devices=60, concurrency=12, buffer_size=5, max_model_version=10, pack_size=4, seed=3)


def spread(round_index: int, device: int, _at: float) -> float:
    """Trip times from 0.5 s to 12 s: a refilled device may arrive before devices sent long before it."""
    return 0.5 + (device * 13 + round_index * 7) % 24 / 2


def test_refilled_devices_form_packs_sent_before_any_of_them_arrives() -> None:
    """Refills of one device join the pack forming on their version: it leaves whole, at a new version, or
    when the clock reaches one of its devices, so every arrival was sent before, in a pack of one version."""
    state, first = schedule.start(PACKED, spread)
    assert first is not None
    events: list[schedule.Event] = [first]
    events += schedule.advance(state, PACKED, spread, trained, stop_after_version=False)
    assert state.version == PACKED.max_model_version
    sent: set[tuple[int, int]] = set()
    refill_packs: list[tuple[int, ...]] = []
    for event in events:
        if isinstance(event, Dispatch):
            assert {trip.round_index for trip in event.trips} == {event.round_index}
            for trip in event.trips:
                assert trip.device in trip.pack and 0 < len(trip.pack) <= PACKED.pack_size
                sent.add((trip.round_index, trip.device))
            if event is not first:
                refill_packs += event.packs()
        elif isinstance(event, Arrival):
            assert (event.trip.round_index, event.trip.device) in sent
    # Each arrival refills one device (min_refill = 1), yet refills train together.
    assert max(len(pack) for pack in refill_packs) == PACKED.pack_size
    assert sum(len(pack) for pack in refill_packs) > 2 * len(refill_packs)
    # Some left short: at a new version, or with the clock at one of their devices.
    assert min(len(pack) for pack in refill_packs) < PACKED.pack_size


def test_forming_packs_resume_from_saved_state_to_the_same_events() -> None:
    """A pass that stops at a missing result saves its forming pack: resumed, the same packs and versions."""
    whole_state, first = schedule.start(PACKED, spread)
    whole = [first, *schedule.advance(whole_state, PACKED, spread, trained, stop_after_version=False)]
    state, first_again = schedule.start(PACKED, spread)
    events: list[schedule.Event | None] = [first_again]
    stored: set[tuple[int, int]] = set()

    def outcome_of(trip: Trip) -> Outcome | None:
        return trained(trip) if (trip.round_index, trip.device) in stored else None

    saw_forming = False
    for _ in range(500):
        if state.done:
            break
        events += schedule.advance(state, PACKED, spread, outcome_of)
        saved = json.loads(json.dumps(state.to_dict()))
        saw_forming = saw_forming or bool(saved["forming"])
        state = ScheduleState.from_dict(saved)
        if state.in_flight:
            head = state.in_flight[0]
            stored.add((head.round_index, head.device))
    assert saw_forming
    assert events == whole
    assert state.to_dict() == whole_state.to_dict()


def test_a_schedule_with_no_device_left_is_stuck_with_a_reason() -> None:
    rules = replace(RULES, device_reuse=False, max_model_version=3)
    state, _ = run_all(rules)
    assert not state.done
    assert state.stuck is not None and "device_reuse = false" in state.stuck


def test_pick_free_is_numpys_choice_among_the_free_devices_listed() -> None:
    # The refill draws by position among the free devices: the same devices as a draw from their list.
    draws = np.random.default_rng(9)
    for trial in range(300):
        num_devices = int(draws.integers(1, 20_000)) if trial % 2 else int(draws.integers(1, 40))
        busy = {int(d) for d in draws.choice(num_devices, size=int(draws.integers(0, num_devices)), replace=False)}
        free = [device for device in range(num_devices) if device not in busy]
        if not free:
            continue
        count = int(draws.integers(1, len(free) + 1))
        listed = np.random.default_rng([4, trial]).choice(free, size=count, replace=False)
        picked = pick_free(np.random.default_rng([4, trial]), busy, len(free), count)
        assert picked == sorted(int(device) for device in listed)


def test_trips_in_flight_are_saved_by_column_and_the_per_trip_form_still_reads() -> None:
    rules = replace(RULES, num_devices=40, concurrency=12, buffer_size=3, pack_size=4, max_model_version=9)
    state, _ = schedule.start(rules, lambda r, d, t: 1.0 + (d * 5 + r) % 7)
    for _ in range(2):  # two versions in: trips of several rounds and packs in flight
        schedule.advance(state, rules, lambda r, d, t: 1.0 + (d * 5 + r) % 7, trained)
    assert len({trip.pack for trip in state.in_flight}) > 1 and len({trip.round_index for trip in state.in_flight}) > 1
    saved = json.loads(json.dumps(state.to_dict()))
    assert "in_flight" not in saved and len(saved["trips"]["arrives"]) == len(state.in_flight)
    assert ScheduleState.from_dict(saved) == state
    # A schedule a running cluster saved before: one list per trip.
    older = {key: value for key, value in saved.items() if key != "trips"}
    older["in_flight"] = [[t.arrives, t.device, t.round_index, t.dispatched, list(t.pack)] for t in state.in_flight]
    assert ScheduleState.from_dict(json.loads(json.dumps(older))) == state
