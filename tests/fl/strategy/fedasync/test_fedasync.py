"""FedAsync (mode = "fedasync"): its arithmetic by hand, its keys, and runs on real Redis and real worker
processes that make the versions and weights of the same experiment computed here with no queue, bit for bit,
with one worker or two."""

from __future__ import annotations

import functools
import json
from typing import Any

import pytest
import torch

from fedqueue.config import Settings
from fedqueue.errors import ConfigError
from fedqueue.fl import api
from fedqueue.fl.config import RunConfig
from fedqueue.fl.store.results import device_tasks, list_rounds
from fedqueue.fl.strategy.fedasync.rule import MIX, mix
from fedqueue.fl.strategy.fedasync.section import FedAsyncSection
from fedqueue.fl.strategy.fedbuff.rule import VersionInputs
from fedqueue.fl.strategy.fedbuff.schedule import Arrival, NewVersion, Trip
from fedqueue.fl.strategy.registry import rules_of, strategy_for
from tests.conftest import running_workers
from tests.support.helpers import assert_same_weights, small_config

FEDASYNC: dict[str, Any] = {
    "mode": "fedasync",
    "num_devices": 16,
    "concurrency": 4,
    "max_model_version": 10,
    "fedasync_alpha": 0.8,
    "fedasync_staleness": "hinge",
    "fedasync_a": 2.0,
    "fedasync_b": 1,
    # Two speed classes far apart: slow devices arrive versions late.
    "device_speed": {"mean": [0.01, 0.06], "std": [0.002, 0.01], "share": [0.5, 0.5]},
}


def fedasync_config(**overrides: Any) -> RunConfig:
    return small_config(**{**FEDASYNC, **overrides})


def test_staleness_functions_are_the_papers() -> None:
    polynomial = FedAsyncSection(fedasync_staleness="polynomial", fedasync_a=0.5)
    assert [polynomial.weight(s) for s in (0, 3, 8)] == [1.0, 0.5, pytest.approx(1 / 3)]
    hinge = FedAsyncSection(fedasync_staleness="hinge", fedasync_a=10.0, fedasync_b=4)
    assert [hinge.weight(s) for s in (0, 4, 5, 6)] == [1.0, 1.0, 1 / 11, 1 / 21]
    assert FedAsyncSection(fedasync_staleness="constant").weight(50) == 1.0


def test_a_version_is_the_current_one_moved_alpha_times_s_towards_the_update() -> None:
    current = {"w": torch.tensor([1.0, 2.0, -4.0]), "seen": torch.tensor([3])}
    local = {"w": torch.tensor([3.0, -2.0, 0.0]), "seen": torch.tensor([9])}
    # x_t = (1 - a) x + a x_new with a = 0.25, by hand; the counter stays the current version's.
    made = mix(current, local, 0.25)
    assert made["w"].tolist() == [1.5, 1.0, -3.0] and made["w"].dtype == torch.float32
    assert made["seen"].tolist() == [3]

    # Through the rule: staleness 3 under the polynomial s with a = 0.5 weighs 0.5, so a = 0.6 * 0.5 = 0.3.
    config = RunConfig.from_dict({"mode": "fedasync", "fedasync_alpha": 0.6, "fedasync_a": 0.5})
    trip = Trip(arrives=9.0, device=2, round_index=2, dispatched=1.0, pack=(2,))
    arrival = Arrival(trip, "folded", 3, config.strategy(FedAsyncSection).weight(3), 5)
    assert arrival.weight == 0.5
    inputs = VersionInputs(
        config=config,
        event=NewVersion(version=5, at=9.0, folded=(arrival,)),
        current=current,
        version_of=lambda version: {},
        local_of=lambda asked: local if asked == trip else {},
        buffer=lambda: iter(()),
        server_state_of=lambda version: None,
        run_id="hand",
        cache=None,  # type: ignore[arg-type]  # this rule keeps nothing per run
    )
    made = MIX.make(inputs).state
    hand = [0.7 * 1.0 + 0.3 * 3.0, 0.7 * 2.0 + 0.3 * -2.0, 0.7 * -4.0 + 0.3 * 0.0]
    assert made["w"].tolist() == pytest.approx(hand, abs=1e-6) and made["seen"].tolist() == [3]


def test_its_keys_are_flat_checked_by_name_and_its_own() -> None:
    config = fedasync_config()
    settings = config.strategy(FedAsyncSection)
    own = (settings.fedasync_alpha, settings.fedasync_staleness, settings.fedasync_a, settings.fedasync_b)
    assert own == (0.8, "hinge", 2.0, 1) and settings.concurrency == 4
    # A version per update, whatever FedBuff's defaults; stored flat and read back the same.
    assert (settings.buffer_size, rules_of(config).buffer_size, rules_of(config).weigh is not None) == (1, 1, True)
    assert config.to_dict()["fedasync_alpha"] == 0.8 and config.to_dict()["buffer_size"] == 1
    assert "strategy_settings" not in config.to_dict()
    assert RunConfig.from_dict(json.loads(json.dumps(config.to_dict()))) == config
    assert "1 updates per version" in strategy_for(config).describe(config)
    refused: list[tuple[dict[str, Any], str]] = [
        ({"fedasync_alpha": 1.5}, "fedasync_alpha: a share in (0, 1]"),
        ({"fedasync_staleness": "cosine"}, "fedasync_staleness: unknown fedasync_staleness 'cosine'"),
        ({"fedasync_staleness": "polynomial"}, 'fedasync_b: applies to fedasync_staleness = "hinge"'),
        ({"fedasync_a": "big"}, "fedasync_a: expected a number"),
        ({"buffer_size": 4}, "buffer_size: mode = 'fedasync' sets it to 1"),
        ({"staleness_weight": "sqrt"}, "staleness_weight: mode = 'fedasync' sets it to 'none'"),
        ({"global_lr": 0.5}, "global_lr: mode = 'fedasync' sets it to 1.0"),
        ({"mode": "fedbuff"}, "fedasync_alpha: applies to mode = 'fedasync'; this run's mode is 'fedbuff'"),
        ({"fedasync_alpah": 0.5}, "fedasync_alpah: unknown setting; did you mean 'fedasync_alpha'?"),
    ]
    for overrides, message in refused:
        with pytest.raises(ConfigError) as raised:
            fedasync_config(**overrides)
        assert str(raised.value).startswith(message), (overrides, str(raised.value))


Made = list[tuple[int, int, int, float]]


def reference(config: RunConfig) -> tuple[Made, dict[str, torch.Tensor]]:
    """Each version's (version, round, device, weight) update and the final weights, made with no queue."""
    return _reference(json.dumps(config.to_dict(), sort_keys=True))


@functools.cache
def _reference(config_json: str) -> tuple[Made, dict[str, torch.Tensor]]:
    from fedqueue.fl.ml.data import device_data, load_federated
    from fedqueue.fl.ml.models import build_model, initial_state
    from fedqueue.fl.ml.seeding import task_seed
    from fedqueue.fl.ml.train import train_local
    from fedqueue.fl.setup import data_spec, device_clock, train_config
    from fedqueue.fl.strategy.fedbuff import schedule

    config = RunConfig.from_dict(json.loads(config_json))
    torch.set_num_threads(1)  # the workers' threads_per_task
    spec = data_spec(config)
    data = load_federated(spec)
    trip_time = device_clock(config, data).trip_seconds
    rules = rules_of(config)
    state, _ = schedule.start(rules, trip_time)
    events = schedule.advance(state, rules, trip_time, lambda _: schedule.Outcome(ok=True), stop_after_version=False)
    versions = {0: initial_state(config.model, data.input_shape, data.num_classes, config.seed)}
    alpha = config.strategy(FedAsyncSection).fedasync_alpha
    made: Made = []
    for event in events:
        if isinstance(event, schedule.NewVersion):
            (arrival,) = event.folded
            trip = arrival.trip
            model = build_model(config.model, data.input_shape, data.num_classes)
            model.load_state_dict(versions[trip.base_version])
            seed = task_seed(config.seed, trip.round_index, trip.device)
            local = train_local(model, device_data(spec, trip.device), train_config(config), seed, torch.device("cpu"))
            versions[event.version] = mix(versions[event.version - 1], local.state, alpha * arrival.weight)
            made.append((event.version, trip.round_index, trip.device, arrival.weight))
    assert len(made) == config.last_version
    return made, versions[len(made)]


def test_the_schedule_mixes_stale_updates_in_with_less() -> None:
    made = reference(fedasync_config())[0]
    weights = [weight for *_, weight in made]
    assert max(weights) == 1.0 and min(weights) < 1.0  # some updates arrive more than b = 1 versions late


@pytest.mark.parametrize("procs", [1, 2])
def test_same_versions_and_weights_with_one_or_two_workers(settings: Settings, procs: int) -> None:
    config = fedasync_config()
    with running_workers(settings, procs=procs):
        handle = api.submit(config, settings=settings)
        handle.wait(180)
    status = handle.status()
    assert status["state"] == "finished", status["error"]
    folded = sorted(
        (row.folded_into, row.round_index, row.device, row.weight)
        for row in device_tasks(handle.store, handle.id)
        if row.fate == "folded"
    )
    made, weights = reference(config)
    assert folded == made
    assert_same_weights(handle.final_weights(), weights)
    done = [row.round_index for row in list_rounds(handle.store, handle.id) if row.state == "done"]
    assert config.last_version is not None and done == list(range(1, config.last_version + 1))
    if procs == 2:  # both processes trained: the result is not one worker's order
        assert len({row.worker for row in device_tasks(handle.store, handle.id)}) == 2
