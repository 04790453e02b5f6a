"""Buffered async (FedBuff) on real Redis and real worker processes.

The fold pass takes updates in simulated-arrival order, so the versions a run makes, and from
which updates, depend on the config alone: one worker or two, a worker SIGKILLed mid-run or a
task delivered twice, the run must make the same versions as the same experiment computed in
this process with no queue at all, down to the last bit of the weights.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import pytest
import torch

from fedqueue.config import Settings
from fedqueue.core.codec import BlobRef
from fedqueue.fl import api
from fedqueue.fl.config import RunConfig
from fedqueue.fl.messages import DeviceTask
from fedqueue.fl.store.results import count_done, device_tasks, get_round, list_rounds
from fedqueue.fl.strategy.fedbuff.section import FedBuffSection
from fedqueue.queue.client import open_client_services
from fedqueue.store import Store
from tests.conftest import running_workers, with_database
from tests.support.helpers import assert_same_weights, small_config
from tests.support.reliability_support import (
    kill_tree,
    launcher,
    reliable_settings,
    slow_config,
    wait_until,
)

BUFFERED: dict[str, Any] = {
    "mode": "fedbuff",
    "num_devices": 24,
    "concurrency": 6,
    "buffer_size": 3,
    "max_model_version": 5,
    "staleness_weight": "polynomial",
    "global_lr": 0.8,
    # Two speed classes far apart: slow devices arrive versions late.
    "device_speed": {"mean": [0.01, 0.05], "std": [0.002, 0.01], "share": [0.6, 0.4]},
    "communication_delay": {"mean": 0.2, "std": 0.05},
}


def buffered_config(**overrides: Any) -> RunConfig:
    return small_config(**{**BUFFERED, **overrides})


Made = list[tuple[int, list[tuple[int, int, float]]]]


def versions(config: RunConfig) -> int:
    """The versions a run of these configs makes: a count (max_model_version or rounds), not bounded by time."""
    assert config.last_version is not None
    return config.last_version


def reference(config: RunConfig) -> tuple[Made, dict[str, torch.Tensor]]:
    """The versions (each from its (round, device, weight) updates) and final weights, made with no queue."""
    return _reference(json.dumps(config.to_dict(), sort_keys=True))


@functools.cache
def _reference(config_json: str) -> tuple[Made, dict[str, torch.Tensor]]:
    from fedqueue.fl.ml.aggregate import fold_buffer, fold_deltas
    from fedqueue.fl.ml.data import device_data, load_federated
    from fedqueue.fl.ml.models import build_model, initial_state
    from fedqueue.fl.ml.seeding import task_seed
    from fedqueue.fl.ml.train import train_local
    from fedqueue.fl.setup import data_spec, device_clock, train_config
    from fedqueue.fl.strategy.fedbuff import schedule
    from fedqueue.fl.strategy.fedrevive.revive import Reviver
    from fedqueue.fl.strategy.registry import rules_of

    config = RunConfig.from_dict(json.loads(config_json))
    torch.set_num_threads(1)  # the workers' threads_per_task
    spec = data_spec(config)
    data = load_federated(spec)
    trip = device_clock(config, data).trip_seconds
    rules = rules_of(config)
    state, _ = schedule.start(rules, trip)
    events = schedule.advance(state, rules, trip, lambda _: schedule.Outcome(ok=True), stop_after_version=False)
    versions = {0: initial_state(config.model, data.input_shape, data.num_classes, config.seed)}
    made = []

    trained: dict[schedule.Trip, dict[str, torch.Tensor]] = {}

    def local(trip: schedule.Trip) -> dict[str, torch.Tensor]:
        if trip not in trained:
            model = build_model(config.model, data.input_shape, data.num_classes)
            model.load_state_dict(versions[trip.base_version])
            seed = task_seed(config.seed, trip.round_index, trip.device)
            outcome = train_local(
                model, device_data(spec, trip.device), train_config(config), seed, torch.device("cpu")
            )
            trained[trip] = outcome.state
        return trained[trip]

    # The tests' workers train on the CPU; so does the reference, on a machine with a GPU too.
    reviver = Reviver(config, torch.device("cpu")) if config.mode == "fedrevive" else None
    server_states: dict[int, bytes | None] = {}
    for event in events:
        if isinstance(event, schedule.NewVersion):
            current = versions[event.version - 1]
            if reviver is not None:
                if config.data_free:  # each version from the state the last one kept, never from memory
                    reviver = Reviver(config, torch.device("cpu"))
                deltas = reviver.deltas(event, versions.__getitem__, local, server_states.__getitem__)
                versions[event.version] = fold_deltas(current, deltas, config.global_lr)
                server_states[event.version] = reviver.server_state(event.version)
            else:
                buffer = [(a.weight, versions[a.trip.base_version], local(a.trip)) for a in event.folded]
                versions[event.version] = fold_buffer(current, buffer, config.global_lr)
            made.append((event.version, [(a.trip.round_index, a.trip.device, a.weight) for a in event.folded]))
    # max_sim_time may end the run before its bound on versions (or it has none).
    assert len(made) == config.last_version or (config.max_sim_time is not None and state.stop is not None)
    return made, versions[len(made)]


def versions_made(store: Store, run_id: str) -> Made:
    """Each version a run made, from the fates its fold passes wrote."""
    folded: dict[int, list[tuple[int, int, float]]] = {}
    for row in device_tasks(store, run_id):
        if row.fate == "folded":
            assert row.folded_into is not None and row.weight is not None
            folded.setdefault(row.folded_into, []).append((row.round_index, row.device, row.weight))
    return [(version, sorted(folded[version])) for version in sorted(folded)]


def sorted_reference(config: RunConfig) -> Made:
    return [(version, sorted(updates)) for version, updates in reference(config)[0]]


def assert_like_reference(handle: api.RunHandle, config: RunConfig) -> None:
    status = handle.status()
    assert status["state"] == "finished", status["error"]
    assert versions_made(handle.store, handle.id) == sorted_reference(config)
    assert_same_weights(handle.final_weights(), reference(config)[1])
    rounds = list_rounds(handle.store, handle.id)
    assert [row.round_index for row in rounds if row.state == "done"] == list(range(1, versions(config) + 1))
    sim = [row.sim_time for row in rounds if row.state == "done"]
    known = [time for time in sim if time is not None]
    assert known == sim == sorted(known)  # every version has its simulated time, in order


def test_schedule_is_stale_enough_to_test_something() -> None:
    """The config above makes stale updates fold in (with weight < 1): the tests below cover them."""
    made = reference(buffered_config())[0]
    weights = [weight for _, updates in made for _, _, weight in updates]
    assert min(weights) < 1.0 and max(weights) == 1.0


@pytest.mark.parametrize("procs", [1, 2])
def test_same_versions_and_weights_with_one_or_two_workers(settings: Settings, procs: int, tmp_path: Path) -> None:
    config = buffered_config()
    with running_workers(settings, procs=procs):
        handle = api.submit(config, settings=settings)
        handle.wait(180)
    assert_like_reference(handle, config)
    if procs == 2:  # both processes trained: the result is not one worker's order
        workers = {row.worker for row in device_tasks(handle.store, handle.id)}
        assert len(workers) == 2
    else:
        assert_reported(handle, config, tmp_path)


def test_refills_train_in_packs_and_make_the_reference_s_versions(settings: Settings) -> None:
    """Refilled devices (one an arrival here) leave in packs formed on their version: trained back to back,
    the packs end on the reference's versions and weights, each device trained alone there, bit for bit."""
    config = buffered_config(pack_size=3, pack_mode="sequential")
    with running_workers(settings, procs=2):
        handle = api.submit(config, settings=settings)
        handle.wait(180)
    assert_like_reference(handle, config)
    trained = [row for row in handle.store.task_timings(handle.id) if row.task_type == "train"]
    refilled_in_packs = {(row.round_index, row.pack) for row in trained if (row.round_index or 0) > 1 and row.pack}
    assert refilled_in_packs, "no refill trained in a pack of several devices"


def assert_reported(handle: api.RunHandle, config: RunConfig, folder: Path) -> None:
    """The report counts what the fold passes did, and draws accuracy against simulated time."""
    from fedqueue.report import write_report

    numbers = write_report(handle.store, handle.id, folder)
    simulated = numbers["simulated"]
    buffered = simulated["buffered"]
    made = reference(config)[0]
    assert (
        buffered["folded"]
        == sum(len(updates) for _, updates in made)
        == config.strategy(FedBuffSection).buffer_size * versions(config)
    )
    assert sum(buffered["staleness"].values()) == buffered["folded"] + buffered["stale"]
    last = list_rounds(handle.store, handle.id)[versions(config) - 1]
    assert simulated["sim_s"] == pytest.approx(last.sim_time, abs=1e-3)
    assert (folder / "simulated.png").stat().st_size > 0
    assert "Simulated time" in (folder / "report.html").read_text()


# FedRevive's clock (its default phases: 0.1 + Exp(1.0 | 1.3 | 1.6) + U(0.15 | 0.25 +- 0.02)) and its
# AFL-DW weighting, with a small s_max so that this short run's stale updates weigh 0.85, 0.5, 0.15 or 0.
THEIR_CLOCK: dict[str, Any] = {
    "clock": "fedrevive",
    "device_speed": {},
    "communication_delay": {},
    "staleness_weight": "afl_dw",
    "staleness_s_max": 2.0,
}


def test_their_clock_and_afl_dw_fold_stale_updates_by_hand_values() -> None:
    """Every folded update weighs AFL-DW's w(s) of the staleness it arrived with, and some are stale."""
    from fedqueue.fl.strategy.fedbuff.staleness import staleness_weight

    made = reference(buffered_config(**THEIR_CLOCK))[0]
    weights = [weight for _, updates in made for _, _, weight in updates]
    assert min(weights) < 1.0 and max(weights) == 1.0
    hand = {0: 1.0, 1: 0.853553, 2: 0.5, 3: 0.146447}
    assert all(any(abs(weight - w) < 1e-6 for w in hand.values()) or weight == 0.0 for weight in weights)
    assert hand == {s: round(staleness_weight("afl_dw", s, s_max=2.0), 6) for s in hand}


def test_their_clock_and_afl_dw_make_the_same_versions_on_two_workers(settings: Settings) -> None:
    config = buffered_config(**THEIR_CLOCK)
    with running_workers(settings, procs=2):
        handle = api.submit(config, settings=settings)
        handle.wait(180)
    assert_like_reference(handle, config)


def test_fedrevive_distils_stale_updates_the_same_way_on_two_workers(settings: Settings) -> None:
    """mode = "fedrevive": each stale update mixed with one distilled from recent local models on the
    server's held-out data; the versions and weights equal the same experiment with no queue."""
    config = buffered_config(
        mode="fedrevive", kd_beta="cosine", kd_beta_factor=2.0, kd_buffer_size=3, kd_iters=3, kd_batch_size=16
    )
    with running_workers(settings, procs=2):
        handle = api.submit(config, settings=settings)
        handle.wait(180)
    assert_like_reference(handle, config)
    # The distillation changed the outcome: with beta = 0 (plain FedBuff on the same devices) it ends elsewhere.
    plain = reference(buffered_config(mode="fedrevive", kd_beta=0.0, kd_buffer_size=3))[1]
    assert any(not torch.equal(plain[name], value) for name, value in handle.final_weights().items())


def test_data_free_fedrevive_continues_its_synthesizer_across_workers(settings: Settings) -> None:
    """kd_augmentation = "dfkd": the generator learns across versions, and the pass making a version
    continues from the state the last one kept, on whichever worker; the weights equal the reference.
    The class proportions are estimated from the uploads (kept with that state too), and the generator
    trains at every second version only."""
    config = buffered_config(
        mode="fedrevive",
        kd_augmentation="dfkd",
        kd_beta="cosine",
        kd_beta_factor=2.0,
        kd_buffer_size=3,
        kd_iters=2,
        kd_batch_size=8,
        dfkd={
            "freeze_rounds": 1,
            "warmup_rounds": 2,
            "nz": 8,
            "ngf": 4,
            "synth_batch_size": 8,
            "g_steps": 2,
            "class_proportion_source": "estimated",
            "proxy_probes": 8,
            "synthesis_interval": 2,
        },
    )
    with running_workers(settings, procs=2):
        handle = api.submit(config, settings=settings)
        handle.wait(180)
    assert_like_reference(handle, config)
    plain = reference(buffered_config(mode="fedrevive", kd_augmentation="dfkd", kd_beta=0.0, kd_buffer_size=3))[1]
    assert any(not torch.equal(plain[name], value) for name, value in handle.final_weights().items())


def test_duplicate_deliveries_are_folded_once_on_postgres(settings: Settings, postgres_url: str) -> None:
    """Every task of the first dispatch is sent a second time: each update is stored and folded once."""
    settings = with_database(settings, postgres_url)
    config = buffered_config()
    with running_workers(settings, procs=2):
        handle = api.submit(config, settings=settings)
        services = open_client_services(settings)
        try:
            first = get_round(services.store, handle.id, 1)
            assert first is not None
            model = BlobRef(key=first.model_key, sha256=first.model_sha256, nbytes=first.model_nbytes)
            services.enqueue(
                [
                    DeviceTask(
                        run_id=handle.id, round_index=1, devices=(device,), model=model, enqueued_at=0.0, round_size=1
                    )
                    for device in first.selected
                ]
            )
        finally:
            services.close()
        handle.wait(180)
    assert_like_reference(handle, config)
    rows = device_tasks(handle.store, handle.id)
    assert len({(row.round_index, row.device) for row in rows}) == len(rows)


@pytest.mark.faults
def test_sigkilled_workers_lose_nothing(settings: Settings, tmp_path: Path) -> None:
    """SIGKILL every worker process at once mid-run; fresh ones (and the scheduler's repairs) finish it the same."""
    settings = reliable_settings(settings)
    config = slow_config(0.05, **BUFFERED)
    first = launcher(settings, procs=2, cwd=tmp_path)
    workers = first.__enter__()
    handle = api.submit(config, settings=settings)
    with api.scheduling(handle) as scheduler:
        wait_until(lambda: count_done(handle.store, handle.id, 2) >= 1, 120, scheduler.tick)
        kill_tree(workers.pid)
        workers.wait()
        first.__exit__(None, None, None)
        with launcher(settings, procs=2, cwd=tmp_path):
            handle.wait(180, tick=scheduler.tick)
    assert_like_reference(handle, config)


@pytest.mark.faults
def test_killed_scheduler_is_resumed_to_the_same_versions(tmp_path: Path) -> None:
    """SIGKILL `fedqueue run` mid-run (its embedded Redis and workers go down with it); `fedqueue resume`
    republishes what Redis lost, sends the lost devices again and makes the same versions."""
    from tests.fl.test_scheduler_recovery import embedded_env, killed_then_resumed

    config = slow_config(0.05, **BUFFERED)
    speed = BUFFERED["device_speed"]
    delay = BUFFERED["communication_delay"]
    plain = {k: v for k, v in config.to_dict().items() if v is not None and not isinstance(v, dict)}
    lines = [
        f"{key} = {str(value).lower() if isinstance(value, bool) else repr(value)}" for key, value in plain.items()
    ]
    lines += [
        f"device_speed = {{ mean = {speed['mean']}, std = {speed['std']}, share = {speed['share']} }}",
        f"communication_delay = {{ mean = {delay['mean']}, std = {delay['std']} }}",
        "[plugin]",
        f"step_sleep = {config.plugin['step_sleep']}",
    ]
    (tmp_path / "run.toml").write_text("\n".join(lines).replace("'", '"') + "\n")
    store, run_id, resumed = killed_then_resumed(
        tmp_path, lambda store, run_id: any(row.state == "done" for row in list_rounds(store, run_id))
    )
    database = embedded_env(tmp_path)["FEDQUEUE_DATABASE_URL"]
    assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-2000:]
    assert "repair:" in resumed.stdout
    assert_like_reference(api.RunHandle(run_id, Settings(database_url=database)), config)


def test_a_fold_asked_for_before_the_schedule_existed_does_not_hold_back_later_requests(settings: Settings) -> None:
    """Results stored while the run starts ask for a pass that finds no schedule yet. That pass must drop
    its request's mark: else the head's own request, made once the schedule is there, is taken for a
    duplicate and nothing ever folds (the run stalls at version 0)."""
    from fedqueue.fl.strategy.fedbuff.fold import fold_updates, request_fold
    from fedqueue.fl.worker.cache import WorkerCache

    config = buffered_config()
    services = open_client_services(settings)
    try:
        services.store.create_run("early", "early", config.to_dict(), versions(config), kind="fl")
        assert request_fold(services, "early")  # a result stored before the schedule was written
        assert not request_fold(services, "early")  # a second one is a duplicate while the first waits
        assert fold_updates(services, WorkerCache(), "early", "worker", 1) == 0  # no schedule: nothing to fold
        assert request_fold(services, "early")  # the head's request, once the schedule is there, goes out
    finally:
        services.close()


def test_a_fold_pass_failing_in_the_worker_that_ran_it_goes_on_as_fold_tasks_that_fail_the_run(
    settings: Settings, tmp_path: Path
) -> None:
    """The worker storing the head's result runs the fold pass itself. A pass that raises there must not
    fail that device task (its result is stored; a retry would skip it and nothing would fold): it is handed
    to fold tasks, whose attempts are counted, and the run ends failed with the pass's reason."""
    settings = reliable_settings(settings, max_attempts=2)
    config = buffered_config(model="fq_reliability:eval_refusing_mlp")
    with launcher(settings, procs=1, cwd=tmp_path):
        handle = api.submit(config, settings=settings)
        wait_until(lambda: handle.store.get_run(handle.id).state != "running", 120)
    run = handle.store.get_run(handle.id)
    assert run.state == "failed"
    assert run.error is not None and "fold pass failed 2 times" in run.error
    assert "this model refuses to evaluate" in run.error
    rows = device_tasks(handle.store, handle.id)
    services = open_client_services(settings)
    try:  # one device per task (small_config): no device task was delivered twice for the pass's failure
        assert rows and all(
            services.ledger.attempts(f"{handle.id}:{row.round_index}:{row.device}") == 1 for row in rows
        )
    finally:
        services.close()


def test_a_run_bounded_by_simulated_time_alone_stops_where_the_reference_does(settings: Settings) -> None:
    """max_sim_time and no bound on versions: two workers make the versions made before the limit, from the
    reference's updates, to its weights; the run names the rule. Nothing is sent to train on the last version."""
    from fedqueue.fl.setup import run_clock
    from fedqueue.fl.strategy.fedbuff import schedule
    from fedqueue.fl.strategy.registry import rules_of

    unbounded = buffered_config()
    trip, rules = run_clock(unbounded).trip_seconds, rules_of(unbounded)
    state, _ = schedule.start(rules, trip)
    events = schedule.advance(state, rules, trip, lambda _: schedule.Outcome(ok=True), stop_after_version=False)
    times = [event.at for event in events if isinstance(event, schedule.NewVersion)]
    arrivals = [event.trip.arrives for event in events if isinstance(event, schedule.Arrival)]
    after = min(at for at in arrivals if at > times[2])
    # Versions 1-3 are made before it, and no update arrives between version 3 and the limit: the pass that
    # makes version 3 also meets the stop, with the refill sent at version 3's instant still in its events.
    limit = (times[2] + after) / 2
    config = buffered_config(max_model_version=None, max_sim_time=limit)
    assert len(reference(config)[0]) == 3
    with running_workers(settings, procs=2):
        handle = api.submit(config, settings=settings)
        handle.wait(180)
    status = handle.status()
    assert status["state"] == "finished", status["error"]
    assert versions_made(handle.store, handle.id) == sorted_reference(config)
    assert_same_weights(handle.final_weights(), reference(config)[1])
    assert status["stop"].startswith(f"stopped: simulated time {limit:g} reached (max_sim_time = {limit:g})")
    assert store_rounds_done(handle.store, handle.id) == [1, 2, 3]


def store_rounds_done(store: Store, run_id: str) -> list[int]:
    return [row.round_index for row in list_rounds(store, run_id) if row.state == "done"]
