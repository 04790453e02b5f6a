"""Buffered asynchronous FL as events on a virtual clock: pure, no I/O, no torch.

The server keeps `concurrency` devices training. Each dispatch is a `Trip`: a device leaves with
the current model version at simulated time t and its update arrives at t plus its modelled
download, training and upload time. Arrivals are taken in simulated order (ties by device, then
round): each is folded into the buffer, dropped as too stale, or counted failed; every
`buffer_size` folded updates make a new version; freed slots are refilled with sampled devices.

Refilled devices leave in packs of `pack_size` (one task trains a pack): a refill's devices join the pack
forming on their version, which is sent once it is whole, when a new version is made, or when the clock
reaches the first of its arrivals, whichever comes first. Each device keeps its own dispatch time and
arrival: packs change which devices a task trains together, never the clock.

Nothing here depends on wall time or on which worker finished first: `advance` takes the next
arrival only once its outcome is stored, so the same seed gives the same versions, from the same
updates, with one worker or fifty, and a worker never sleeps for a simulated delay.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from fedqueue.fl.clock.stops import Stop, StopRules, time_stop, version_stop
from fedqueue.fl.strategy.fedbuff.staleness import is_too_stale, staleness_weight

REFILL_STREAM = 0xFB0F  # keeps the refill draws apart from every other use of the run's seed


@dataclass(frozen=True)
class Rules:
    """The knobs of a buffered-async run that decide its schedule."""

    num_devices: int
    concurrency: int
    buffer_size: int
    max_model_version: int | None  # None: bounded by max_sim_time alone
    max_staleness: int | None
    min_refill: int
    device_reuse: bool
    seed: int
    staleness_weight: str
    staleness_exponent: float
    pack_size: int = 1
    staleness_s_max: float = 75.0  # afl_dw's s_max
    keep_recent: int = 0  # folded updates each arrival remembers, newest last (FedRevive's teachers)
    max_sim_time: float | None = None  # an arrival at or after it is never taken: the run ends
    bound: str = "max_model_version"  # the knob that set max_model_version (max_rounds is its alias)
    # A version rule's own weight of an update by its staleness, in place of `staleness_weight` (FedAsync's s()).
    weigh: Callable[[int], float] | None = None

    @property
    def stops(self) -> StopRules:
        return StopRules(last_version=self.max_model_version, bound=self.bound, max_sim_time=self.max_sim_time)


class Trip(NamedTuple):
    """One dispatch of one device; ordered by simulated arrival (ties by device, then round).

    A tuple, not a dataclass: a schedule holds a trip per device in flight, made from its saved form and
    compared in order on every fold pass, and a tuple is made and compared in C.
    """

    arrives: float
    device: int
    round_index: int  # the version it trains on, plus one (as a synchronous round trains on round - 1)
    dispatched: float
    pack: tuple[int, ...]  # the devices of the task it travels in, sorted (empty while its pack forms)

    @property
    def base_version(self) -> int:
        return self.round_index - 1

    def to_list(self) -> list[Any]:
        return [self.arrives, self.device, self.round_index, self.dispatched, list(self.pack)]

    @classmethod
    def from_list(cls, raw: list[Any]) -> Trip:
        arrives, device, round_index, dispatched, pack = raw
        return cls(float(arrives), int(device), int(round_index), float(dispatched), tuple(int(d) for d in pack))


@dataclass(frozen=True)
class Outcome:
    """A trip's stored result: trained (with its samples) or failed every attempt."""

    ok: bool
    samples: int = 0


@dataclass(frozen=True)
class Arrival:
    """A trip taken in simulated order, and what became of it."""

    trip: Trip
    fate: str  # folded | stale | failed
    staleness: int  # versions made since its base version, when it arrived
    weight: float  # its staleness weight (0 unless folded)
    version: int  # folded: the version it goes into; otherwise the version current when it arrived
    recent: tuple[Trip, ...] = ()  # folded: the last `keep_recent` folded trips, itself the newest


@dataclass(frozen=True)
class NewVersion:
    """`buffer_size` folded updates make version `version` at simulated time `at`."""

    version: int
    at: float
    folded: tuple[Arrival, ...]


@dataclass(frozen=True)
class Dispatch:
    """Packs of devices sent at simulated time `at` to train on version `round_index - 1` (each device
    dispatched at its trip's own time: a refill's devices may wait for their pack to fill)."""

    round_index: int
    at: float
    trips: tuple[Trip, ...]

    def packs(self) -> list[tuple[int, ...]]:
        return list(dict.fromkeys(trip.pack for trip in self.trips))


Event = Arrival | NewVersion | Dispatch
# (round_index, device, dispatched at) -> simulated seconds until the update arrives.
TripTime = Callable[[int, int, float], float]
OutcomeOf = Callable[[Trip], Outcome | None]


@dataclass
class ScheduleState:
    """Where a buffered-async run stands on its virtual clock; saved as JSON between fold passes."""

    version: int = 0
    now: float = 0.0  # simulated time of the last arrival taken
    in_flight: list[Trip] = field(default_factory=list)  # sent, sorted by arrival
    forming: list[Trip] = field(default_factory=list)  # refilled into the pack not sent yet, in refill order
    buffer: list[Arrival] = field(default_factory=list)  # folded into the next version
    free: int = 0  # slots freed and not refilled yet
    refills: int = 0  # refills drawn so far: each draws from its own seeded stream
    used: set[int] = field(default_factory=set)  # devices ever dispatched (kept when device_reuse is off)
    on_version: set[int] = field(default_factory=set)  # devices dispatched with the current version
    recent: list[Trip] = field(default_factory=list)  # the last `keep_recent` folded trips, newest last
    folded: int = 0
    stale: int = 0
    failed: int = 0
    done: bool = False
    stuck: str | None = None  # why no device can be dispatched and nothing is in flight
    made_at: float | None = None  # simulated time the current version was made
    stop: Stop | None = None  # the rule that ended the run (done)
    # Accuracy of the most recent evaluation and the best so far: FedRevive's accuracy stops read them.
    last_accuracy: float | None = None
    best_accuracy: float | None = None

    def end(self, stop: Stop) -> None:
        self.done, self.stop = True, stop

    def evaluated(self, accuracy: float) -> None:
        self.last_accuracy = accuracy
        self.best_accuracy = accuracy if self.best_accuracy is None else max(self.best_accuracy, accuracy)

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "now": self.now,
            "trips": _trips_to_dict(self.in_flight),
            "forming": [trip.to_list() for trip in self.forming],
            "buffer": [
                [a.trip.to_list(), a.fate, a.staleness, a.weight, a.version, [t.to_list() for t in a.recent]]
                for a in self.buffer
            ],
            "recent": [trip.to_list() for trip in self.recent],
            "free": self.free,
            "refills": self.refills,
            "used": sorted(self.used),
            "on_version": sorted(self.on_version),
            "folded": self.folded,
            "stale": self.stale,
            "failed": self.failed,
            "done": self.done,
            "stuck": self.stuck,
            "made_at": self.made_at,
            "stop": None if self.stop is None else self.stop.to_dict(),
            "last_accuracy": self.last_accuracy,
            "best_accuracy": self.best_accuracy,
        }

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> ScheduleState:
        return cls(
            version=int(raw["version"]),
            now=float(raw["now"]),
            # A schedule saved before trips were kept by column lists each trip.
            in_flight=_trips_from_dict(raw["trips"])
            if "trips" in raw
            else [Trip.from_list(t) for t in raw["in_flight"]],
            forming=[Trip.from_list(trip) for trip in raw.get("forming", [])],  # absent: saved before packs formed
            buffer=[
                Arrival(
                    Trip.from_list(trip),
                    fate,
                    int(staleness),
                    float(weight),
                    int(version),
                    tuple(Trip.from_list(t) for t in recent),
                )
                for trip, fate, staleness, weight, version, recent in raw["buffer"]
            ],
            recent=[Trip.from_list(trip) for trip in raw.get("recent", [])],
            free=int(raw["free"]),
            refills=int(raw["refills"]),
            used=set(raw["used"]),
            on_version=set(raw["on_version"]),
            folded=int(raw["folded"]),
            stale=int(raw["stale"]),
            failed=int(raw["failed"]),
            done=bool(raw["done"]),
            stuck=raw["stuck"],
            # Absent from a schedule saved before stop rules existed.
            made_at=raw.get("made_at"),
            stop=None if raw.get("stop") is None else Stop.from_dict(raw["stop"]),
            last_accuracy=raw.get("last_accuracy"),
            best_accuracy=raw.get("best_accuracy"),
        )


def _trips_to_dict(trips: list[Trip]) -> dict[str, Any]:
    """Trips in flight by column, each pack's round and devices once: a fold pass saves and reads them all, and
    a thousand in flight made its schedule's largest part."""
    packs: dict[tuple[int, tuple[int, ...]], int] = {}
    pack_of = [packs.setdefault((trip.round_index, trip.pack), len(packs)) for trip in trips]
    return {
        "packs": [[round_index, list(pack)] for round_index, pack in packs],
        "arrives": [trip.arrives for trip in trips],
        "device": [trip.device for trip in trips],
        "dispatched": [trip.dispatched for trip in trips],
        "pack": pack_of,
    }


def _trips_from_dict(raw: dict[str, Any]) -> list[Trip]:
    if "dispatched" not in raw:  # saved when a pack's devices all left at one time: kept with the pack
        packs = [(int(round_index), tuple(pack)) for round_index, _, pack in raw["packs"]]
        left = [float(raw["packs"][index][1]) for index in raw["pack"]]
    else:
        packs = [(int(round_index), tuple(pack)) for round_index, pack in raw["packs"]]
        left = [float(dispatched) for dispatched in raw["dispatched"]]
    return [
        Trip(float(arrives), device, packs[index][0], dispatched, packs[index][1])
        for arrives, device, dispatched, index in zip(raw["arrives"], raw["device"], left, raw["pack"], strict=True)
    ]


def start(rules: Rules, trip_time: TripTime) -> tuple[ScheduleState, Dispatch | None]:
    """A run's first state: every slot filled at simulated time 0 with version 0, all sent (the last pack short)."""
    state = ScheduleState(free=rules.concurrency)
    _draw(state, rules, trip_time)
    return state, _send_forming(state, rules, whole_only=False)


def advance(
    state: ScheduleState,
    rules: Rules,
    trip_time: TripTime,
    outcome_of: OutcomeOf,
    *,
    stop_after_version: bool = True,
) -> list[Event]:
    """Take arrivals in simulated order while their outcomes are stored; changes `state`.

    Stops at the first arrival with no stored outcome, when the run is done, and (with
    `stop_after_version`) right after a new version and the refill at the same instant, so the
    caller can make that version before anything trains on it.
    """
    events: list[Event] = []
    while (state.in_flight or state.forming) and not state.done:
        _send_forming_if_due(state, rules, events)
        head = state.in_flight[0]
        # Known from the dispatch, before its result is stored: the run ends without waiting for it.
        late = time_stop(rules.stops, state.version, state.made_at, head.arrives)
        if late is not None:
            state.end(late)
            break
        outcome = outcome_of(head)
        if outcome is None:
            break
        state.in_flight.pop(0)
        state.now = head.arrives
        arrival = _arrive(state, rules, head, outcome)
        events.append(arrival)
        state.free += 1
        made = None
        if len(state.buffer) >= rules.buffer_size:
            _send_forming_now(state, rules, events)  # a pack trains on one version: the one it formed on
            made = NewVersion(state.version + 1, state.now, tuple(state.buffer))
            state.version += 1
            state.buffer = []
            state.on_version = set()
            state.made_at = state.now
            events.append(made)
            last = version_stop(rules.stops, state.version, state.now)
            if last is not None:
                state.end(last)
                break
        dispatch = _refill(state, rules, trip_time)
        if dispatch is not None:
            events.append(dispatch)
        if made is not None and stop_after_version:
            break
    if not state.done:
        _send_forming_if_due(state, rules, events)  # the head a caller names is the clock's next arrival
    if not state.in_flight and not state.done:
        state.stuck = (
            f"no device can be sent out at version {state.version}: every device is training, already"
            " trained on this version"
            + ("" if rules.device_reuse else ", or was used before (device_reuse = false)")
            + f"; {len(state.buffer)} of buffer_size = {rules.buffer_size} updates are buffered"
        )
    return events


def _arrive(state: ScheduleState, rules: Rules, trip: Trip, outcome: Outcome) -> Arrival:
    staleness = state.version - trip.base_version
    if not outcome.ok:
        state.failed += 1
        return Arrival(trip, "failed", staleness, 0.0, state.version)
    if is_too_stale(staleness, rules.max_staleness):
        state.stale += 1
        return Arrival(trip, "stale", staleness, 0.0, state.version)
    if rules.weigh is not None:
        weight = rules.weigh(staleness)
    else:
        weight = staleness_weight(rules.staleness_weight, staleness, rules.staleness_exponent, rules.staleness_s_max)
    if rules.keep_recent:
        state.recent = [*state.recent, trip][-rules.keep_recent :]
    arrival = Arrival(trip, "folded", staleness, weight, state.version + 1, tuple(state.recent))
    state.buffer.append(arrival)
    state.folded += 1
    return arrival


def _refill(state: ScheduleState, rules: Rules, trip_time: TripTime) -> Dispatch | None:
    """Draw devices for the free slots, once at least `min_refill` are free; the whole packs they make are sent."""
    _draw(state, rules, trip_time)
    return _send_forming(state, rules, whole_only=True)


def _draw(state: ScheduleState, rules: Rules, trip_time: TripTime) -> None:
    """Devices for the free slots, once at least `min_refill` are free, drawn into the forming pack."""
    if state.done or state.free < rules.min_refill:
        return
    busy = {trip.device for trip in state.in_flight} | {trip.device for trip in state.forming} | state.on_version
    if not rules.device_reuse:
        busy |= state.used
    count = min(state.free, rules.num_devices - len(busy))
    if count == 0:
        return
    rng = np.random.default_rng([rules.seed, REFILL_STREAM, state.refills])
    chosen = pick_free(rng, busy, rules.num_devices - len(busy), count)
    state.refills += 1
    state.free -= count
    round_index = state.version + 1
    state.forming += [
        Trip(state.now + trip_time(round_index, device, state.now), device, round_index, state.now, ())
        for device in chosen
    ]
    state.on_version.update(chosen)
    if not rules.device_reuse:
        state.used.update(chosen)


def _send_forming_if_due(state: ScheduleState, rules: Rules, events: list[Event]) -> None:
    """The forming pack is sent once the clock's next arrival is one of its devices': nothing else is taken
    before that device's result, and no result comes of a task never sent."""
    if state.forming and (not state.in_flight or min(state.forming) < state.in_flight[0]):
        _send_forming_now(state, rules, events)


def _send_forming_now(state: ScheduleState, rules: Rules, events: list[Event]) -> None:
    dispatch = _send_forming(state, rules, whole_only=False)
    if dispatch is not None:
        events.append(dispatch)


def _send_forming(state: ScheduleState, rules: Rules, whole_only: bool) -> Dispatch | None:
    """The forming devices sent in packs of `pack_size`, in the order they were drawn: the whole packs only,
    or all of them (the last pack short). None when none is sent."""
    size = max(1, rules.pack_size)
    count = len(state.forming) - len(state.forming) % size if whole_only else len(state.forming)
    if count == 0:
        return None
    leaving, state.forming = state.forming[:count], state.forming[count:]
    trips: list[Trip] = []
    for start_at in range(0, count, size):
        members = leaving[start_at : start_at + size]
        pack = tuple(sorted(trip.device for trip in members))
        trips += [trip._replace(pack=pack) for trip in members]
    for trip in trips:
        bisect.insort(state.in_flight, trip)
    return Dispatch(trips[0].round_index, state.now, tuple(trips))


def pick_free(rng: np.random.Generator, busy: set[int], free: int, count: int) -> list[int]:
    """`count` of the devices not in `busy`, sorted: rng.choice(the free devices in order, count, replace=False)
    drawn by position, so without listing the free devices (the draw depends on their number alone)."""
    positions = rng.choice(free, size=count, replace=False)
    taken = np.fromiter(sorted(busy), dtype=np.int64, count=len(busy))
    # The p-th free device is p plus the busy devices below it: those whose free devices before them are <= p.
    before = taken - np.arange(len(taken), dtype=np.int64)
    return sorted(int(device) for device in positions + np.searchsorted(before, positions, side="right"))
