"""FedRevive's stop rules: each ends a run where their simulator would, and the run names it.

The rules themselves and the schedule are pure; whole runs go through the queue's in-memory twins,
with every message handled in this process (a worker's loop, one task at a time).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from fedqueue.config import Settings
from fedqueue.core.broker.memory import RecordingEnqueuer, memory_services
from fedqueue.core.database import open_store
from fedqueue.core.services import Services
from fedqueue.errors import ConfigError
from fedqueue.fl.clock.stops import StopRules, accuracy_stop, time_stop, version_stop
from fedqueue.fl.config import RunConfig
from fedqueue.fl.messages import AggregateTask, DeviceTask, FoldTask
from fedqueue.fl.scheduler import submit_run
from fedqueue.fl.store.results import list_rounds
from fedqueue.fl.store.stop_rows import get_stop
from fedqueue.fl.strategy.fedbuff import schedule
from fedqueue.fl.strategy.fedbuff.fold import fold_updates
from fedqueue.fl.strategy.fedbuff.schedule import NewVersion, Outcome, Rules
from fedqueue.fl.strategy.registry import strategy_for
from fedqueue.fl.strategy.sync.rounds import aggregate_round
from fedqueue.fl.view.summary import run_status
from fedqueue.fl.worker.cache import WorkerCache
from fedqueue.fl.worker.device_task import run_device_task
from fedqueue.store import Store
from tests.support.helpers import small_config

SETTINGS = Settings(key_prefix="stops", heartbeat_ttl_s=30, max_attempts=3, max_lost_attempts=3)
CLOCK: dict[str, Any] = {
    "device_speed": {"mean": [0.01, 0.05], "std": [0.002, 0.01], "share": [0.6, 0.4]},
    "communication_delay": {"mean": 0.2, "std": 0.05},
}
BUFFERED: dict[str, Any] = {"mode": "fedbuff", "concurrency": 6, "buffer_size": 3, "staleness_weight": "polynomial"}


# --- The config.


def test_max_rounds_sets_the_modes_own_bound() -> None:
    assert RunConfig.from_dict({"max_rounds": 4}).rounds == 4
    assert small_config(rounds=4, max_rounds=4).rounds == 4  # both given: they agree
    buffered = small_config(**BUFFERED, max_rounds=6)
    assert buffered.max_model_version == buffered.last_version == 6
    assert buffered.stop_rules().bound == "max_rounds" and small_config().stop_rules().bound == "rounds"
    assert small_config(**BUFFERED, max_rounds=6, max_model_version=6).last_version == 6
    # Stored and read back, the config is the same.
    assert RunConfig.from_dict(buffered.to_dict()) == buffered


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"max_rounds": 4, "rounds": 3}, "max_rounds"),
        ({**BUFFERED, "max_rounds": 4, "max_model_version": 5}, "max_rounds"),
        ({"max_rounds": 0}, "max_rounds"),
        ({"max_sim_time": 0}, "max_sim_time"),
        ({"max_sim_time": "long"}, "max_sim_time"),
        ({"target_accuracy": 1.5}, "target_accuracy"),
        ({"early_stop": {"version": 2, "accuracy": 0.1}}, "early_stop"),
        ({"early_stop": [{"round": 2, "acc": 0.1}]}, "early_stop"),
        ({"early_stop": [{"version": 0, "accuracy": 0.1}]}, "early_stop"),
        ({"early_stop": [{"version": 2, "accuracy": 2}]}, "early_stop"),
        ({"early_stop": [{"version": 3, "accuracy": 0.1}], "eval_every": 2}, "early_stop"),
    ],
)
def test_bad_stops_name_their_field(overrides: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError, match=rf"^{field}:"):
        small_config(**overrides)


def test_a_buffered_run_may_be_bounded_by_simulated_time_alone() -> None:
    config = small_config(**BUFFERED, max_sim_time=3.0)
    assert config.last_version is None and config.max_sim_time == 3.0
    # With neither bound, `rounds` bounds it, as it always has (stored runs read back the same).
    assert small_config(**BUFFERED, rounds=4).last_version == 4


# --- The rules.


def test_target_reads_the_last_evaluation_and_early_stop_the_best() -> None:
    rules = StopRules(last_version=100, target_accuracy=0.8, early_stop=((10, 0.3),))
    assert accuracy_stop(rules, 5, 1.0, last=0.7, best=0.85) is None  # the last one counts, not the best
    hit = accuracy_stop(rules, 5, 1.0, last=0.8, best=0.8)
    assert hit is not None and hit.rule == "target_accuracy" and "0.8000 at version 5" in hit.reason
    assert accuracy_stop(rules, 9, 1.0, last=0.1, best=0.2) is None  # before its version
    floor = accuracy_stop(rules, 10, 1.0, last=0.1, best=0.3)
    assert floor is not None and floor.rule == "early_stop" and floor.version == 10
    assert accuracy_stop(rules, 10, 1.0, last=0.1, best=0.31) is None
    assert accuracy_stop(rules, 10, 1.0, last=None, best=None) is None  # nothing evaluated yet


def test_bounds_and_time_name_their_rule() -> None:
    rules = StopRules(last_version=5, bound="max_rounds", max_sim_time=200.0)
    bound = version_stop(rules, 5, 12.5)
    assert bound is not None and bound.reason == "stopped: version 5 reached (max_rounds = 5)"
    assert version_stop(rules, 4, 12.0) is None
    assert time_stop(rules, 4, 199.0, 199.9) is None
    late = time_stop(rules, 4, 199.0, 200.0)  # at the limit: not taken, as in FedRevive's simulator
    assert late is not None and late.rule == "max_sim_time" and late.version == 4
    assert late.reason.startswith("stopped: simulated time 200 reached (max_sim_time = 200)")


# --- The schedule.

SECONDS = {0: 1.0, 1: 2.0, 2: 5.0}
RULES = Rules(
    num_devices=3,
    concurrency=3,
    buffer_size=2,
    max_model_version=None,
    max_staleness=None,
    min_refill=1,
    device_reuse=True,
    seed=0,
    staleness_weight="none",
    staleness_exponent=0.5,
    max_sim_time=9.5,
)


def _trip(_round: int, device: int, _at: float) -> float:
    return SECONDS[device]


def _run(rules: Rules) -> tuple[schedule.ScheduleState, list[NewVersion]]:
    state, _ = schedule.start(rules, _trip)
    events = schedule.advance(state, rules, _trip, lambda _: Outcome(ok=True), stop_after_version=False)
    return state, [event for event in events if isinstance(event, NewVersion)]


def test_simulated_time_ends_a_schedule_before_the_first_arrival_past_it() -> None:
    state, made = _run(RULES)
    unbounded, all_made = _run(replace(RULES, max_sim_time=None, max_model_version=20))
    assert made == [version for version in all_made if version.at < 9.5]  # the same versions, cut at the limit
    assert state.done and state.stop is not None and state.stop.rule == "max_sim_time"
    assert state.stop.version == made[-1].version and state.in_flight[0].arrives >= 9.5
    # Saved and read back, the stop and the time of the last version stay.
    again = schedule.ScheduleState.from_dict(state.to_dict())
    assert again.stop == state.stop and again.made_at == made[-1].at


def test_the_bound_on_versions_is_named_by_its_knob() -> None:
    state, made = _run(replace(RULES, max_sim_time=None, max_model_version=3, bound="max_rounds"))
    assert [version.version for version in made] == [1, 2, 3]
    assert state.stop is not None and state.stop.reason == "stopped: version 3 reached (max_rounds = 3)"


# --- Whole runs on the in-memory twins.


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    opened = open_store(f"sqlite:///{tmp_path / 'store.db'}", migrate=True)
    yield opened
    opened.close()


def run_here(store: Store, config: RunConfig) -> tuple[Services, str]:
    """Submit and handle every message in this process, in the order sent, until the run ends."""
    services = memory_services(SETTINGS, store)
    run_id = submit_run(services, config)
    sent = services.enqueue
    assert isinstance(sent, RecordingEnqueuer)
    cache, strategy = WorkerCache(), strategy_for(config)
    while store.get_run(run_id).state == "running":
        waiting = sent.take()
        assert waiting, "the run waits on nothing"
        for message in waiting:
            if isinstance(message, DeviceTask):
                run_device_task(services, cache, message, "here", 1, strategy)
            elif isinstance(message, AggregateTask):
                aggregate_round(services, run_id, message.round_index, "here#1")
            elif isinstance(message, FoldTask):
                fold_updates(services, cache, run_id, "here", 1)
    return services, run_id


def stopped(store: Store, run_id: str) -> tuple[str, int, list[int]]:
    stop = get_stop(store, run_id)
    assert stop is not None and store.get_run(run_id).state == "finished"
    done = [row.round_index for row in list_rounds(store, run_id) if row.state == "done"]
    return stop.rule, stop.version, done


def test_a_sync_run_ends_on_the_last_round_within_simulated_time(store: Store) -> None:
    # torch: the clock reads the devices' data
    from fedqueue.fl.setup import run_clock
    from fedqueue.fl.strategy.sync.rounds import select_devices

    config = small_config(rounds=6, **CLOCK)
    clock = run_clock(config)
    ends, at = [], 0.0
    for round_index in range(1, 7):
        devices = select_devices(config.seed, round_index, config.num_devices, config.devices_per_round)
        at += max(clock.trip_seconds(round_index, device) for device in devices)
        ends.append(at)
    limit = (ends[2] + ends[3]) / 2  # rounds 1-3 end before it, round 4 after
    _, run_id = run_here(store, replace(config, max_sim_time=limit))
    assert stopped(store, run_id) == ("max_sim_time", 3, [1, 2, 3])
    assert store.get_run(run_id).rounds_total == 3  # known at submit
    rows = list_rounds(store, run_id)
    assert rows[-1].sim_time == pytest.approx(ends[2]) and rows[-1].accuracy is not None  # the last is evaluated
    status = run_status(store, store.get_run(run_id), [])
    assert status["stop"].startswith(f"stopped: simulated time {limit:g} reached")
    assert status["sim_budget"]["used"] == pytest.approx(ends[2], abs=1e-3)


def test_a_sync_run_past_its_time_at_round_one_is_refused(store: Store) -> None:
    with pytest.raises(ConfigError, match="^max_sim_time: round 1 already ends"):
        run_here(store, small_config(rounds=3, max_sim_time=0.001, **CLOCK))


@pytest.mark.parametrize(
    ("stops", "expected"),
    [
        ({"target_accuracy": 0.01}, ("target_accuracy", 1, [1])),
        ({"early_stop": [{"version": 2, "accuracy": 1.0}]}, ("early_stop", 2, [1, 2])),
        ({"max_rounds": 3}, ("max_rounds", 3, [1, 2, 3])),
        ({}, ("rounds", 3, [1, 2, 3])),
    ],
)
def test_each_rule_ends_a_sync_run_and_is_named(
    store: Store, stops: dict[str, Any], expected: tuple[str, int, list[int]]
) -> None:
    _, run_id = run_here(store, small_config(rounds=3, **stops))
    assert stopped(store, run_id) == expected


@pytest.mark.parametrize(
    ("stops", "rule"),
    [
        ({"max_sim_time": 1.0}, "max_sim_time"),
        ({"max_model_version": 3, "target_accuracy": 0.01}, "target_accuracy"),
        ({"max_model_version": 4, "early_stop": [{"version": 2, "accuracy": 1.0}]}, "early_stop"),
        ({"max_rounds": 2}, "max_rounds"),
        ({"max_model_version": 2}, "max_model_version"),
    ],
)
def test_each_rule_ends_a_buffered_run_and_is_named(store: Store, stops: dict[str, Any], rule: str) -> None:
    config = small_config(**BUFFERED, **CLOCK, **stops)
    _, run_id = run_here(store, config)
    named, version, done = stopped(store, run_id)
    assert named == rule and done == list(range(1, version + 1))
    expected = {"target_accuracy": 1, "early_stop": 2, "max_rounds": 2, "max_model_version": 2}
    if rule in expected:
        assert version == expected[rule]
    else:  # the last version came before the limit; the last version is evaluated at the stop
        rows = list_rounds(store, run_id)
        assert rows[version - 1].sim_time is not None and rows[version - 1].sim_time < 1.0  # type: ignore[operator]
        assert rows[version - 1].accuracy is not None
