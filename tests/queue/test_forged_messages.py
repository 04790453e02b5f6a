"""Forged and poison messages pushed by hand onto a deployment's queues, as anyone who can write to Redis could.

Each run ends with the weights of a run nobody tampered with, bit for bit; every forged or poison message is
refused once, logged and dead-lettered, and the workers that met them keep running.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
import redis

from fedqueue.config import Settings
from fedqueue.core.broker import keys
from fedqueue.core.broker.dead_letters import recent_dead_letters
from fedqueue.core.services import Services
from fedqueue.core.signing import sign
from fedqueue.fl.config import RunConfig
from fedqueue.fl.kind import TRAIN_DEVICE
from fedqueue.fl.messages import DEVICES_QUEUE, DeviceTask
from fedqueue.fl.ml.weights import encode_state
from fedqueue.fl.scheduler import submit_run
from fedqueue.fl.store.results import device_tasks, get_round
from fedqueue.fl.strategy.common import final_state
from fedqueue.queue.app import make_app
from fedqueue.queue.client import open_client_services
from tests.conftest import running_workers
from tests.fl.strategy.fedbuff.test_buffered_async import buffered_config, reference
from tests.support.cli_inputs import cli_env
from tests.support.cli_runner import fedqueue_cli
from tests.support.helpers import assert_same_weights, reference_final_state, small_config, wait_finished
from tests.support.reliability_support import wait_until

pytestmark = pytest.mark.faults


def _client(settings: Settings) -> redis.Redis:
    return redis.Redis.from_url(settings.broker_url or "")


def _queue_key(settings: Settings) -> str:
    return keys.queue_list(settings.key_prefix, settings.queue(DEVICES_QUEUE))


def push_first(settings: Settings, body: Any, **kwargs: Any) -> None:
    """Send a device-task message as any Celery client would, then move it where workers take the next one."""
    app = make_app(settings)
    try:
        app.send_task(TRAIN_DEVICE, args=[body], kwargs=kwargs, queue=settings.queue(DEVICES_QUEUE))
    finally:
        app.close()
    client = _client(settings)
    sent = client.lpop(_queue_key(settings))  # kombu pushes on the left ...
    assert isinstance(sent, bytes)  # the message just sent, undecoded
    client.rpush(_queue_key(settings), sent)  # ... and workers pop on the right


def push_raw_first(settings: Settings, raw: bytes) -> None:
    _client(settings).rpush(_queue_key(settings), raw)


def dead_letters(settings: Settings) -> list[str]:
    count, records = recent_dead_letters(_client(settings), settings.key_prefix, last=100)
    assert count == len(records)
    return [record.why for record in records]


def worker_log(logs: Path) -> str:
    return "".join(path.read_text() for path in logs.glob("*.log"))


def first_task(services: Services, run_id: str, config: RunConfig, round_index: int = 1) -> DeviceTask:
    """A task exactly as the scheduler sent it for the round's first selected device."""
    row = get_round(services.store, run_id, round_index)
    assert row is not None
    model = {"key": row.model_key, "sha256": row.model_sha256, "nbytes": row.model_nbytes}
    round_size = len(row.selected) if not config.strategy_mode.asynchronous else 1
    return DeviceTask.from_dict(
        {
            "run_id": run_id,
            "round_index": round_index,
            "devices": [row.selected[0]],
            "model": model,
            "enqueued_at": 0.0,
            "round_size": round_size,
            "mode": "sequential",
        }
    )


def forge(services: Services, run_id: str, config: RunConfig) -> dict[str, dict[str, Any]]:
    """Well-formed device tasks the scheduler never sent, by what is wrong with them."""
    task = first_task(services, run_id, config)
    row = get_round(services.store, run_id, 1)
    assert row is not None
    unselected = min(set(range(config.num_devices)) - set(row.selected))
    other_model = services.blobs.put(f"{run_id}/forged", encode_state(final_state_of_noise(config)))
    forged = {
        "not selected": dataclasses.replace(task, devices=(unselected,)),
        "another model": dataclasses.replace(task, model=other_model),
        "unknown run": dataclasses.replace(task, run_id="no-such-run"),
    }
    if not config.strategy_mode.asynchronous:
        forged["round size"] = dataclasses.replace(task, round_size=1)
        forged["not a pack"] = dataclasses.replace(task, devices=tuple(row.selected[:2]))
    return {why: message.to_dict() for why, message in forged.items()}


def final_state_of_noise(config: RunConfig) -> dict[str, Any]:
    from fedqueue.fl.ml.data import load_federated
    from fedqueue.fl.ml.models import initial_state
    from fedqueue.fl.setup import data_spec

    data = load_federated(data_spec(config))
    return initial_state(config.model, data.input_shape, data.num_classes, config.seed + 1)


def test_forged_device_tasks_are_refused_and_the_run_keeps_its_weights(settings: Settings, tmp_path: Path) -> None:
    config = small_config(rounds=3)
    services = open_client_services(settings)
    run_id = submit_run(services, config)  # no worker yet: the forged tasks are taken first
    forged = forge(services, run_id, config)
    for body in forged.values():
        push_first(settings, body)
    duplicate = first_task(services, run_id, config).to_dict()  # the same work again: stored once
    push_first(settings, duplicate)
    logs = tmp_path / "logs"
    with running_workers(settings, procs=1, log_dir=logs):
        wait_finished(services.store, run_id, 180)
    assert services.store.get_run(run_id).state == "finished"
    assert_same_weights(final_state(services.store, run_id), reference_final_state(config))
    assert len(device_tasks(services.store, run_id)) == config.rounds * config.devices_per_round
    refused = dead_letters(settings)
    assert len(refused) == len(forged), refused  # each once, never put back
    expected = {
        "not selected": "never sent out device",
        "another model": "trains ",
        "unknown run": "run no-such-run is not in the store",
        "round size": "has 8 devices, not 1",
        "not a pack": "sent no pack of devices",
    }
    for why in forged:
        assert sum(expected[why] in line for line in refused) == 1, (why, refused)
    assert worker_log(logs).count("refused, not work its run sent") == len(forged)


def test_a_forged_trip_is_refused_and_fedbuff_keeps_its_weights(settings: Settings, tmp_path: Path) -> None:
    config = buffered_config()
    services = open_client_services(settings)
    run_id = submit_run(services, config)
    forged = forge(services, run_id, config)
    for body in forged.values():
        push_first(settings, body)
    with running_workers(settings, procs=2, log_dir=tmp_path / "logs"):
        wait_finished(services.store, run_id, 180)
    assert services.store.get_run(run_id).state == "finished"
    assert_same_weights(final_state(services.store, run_id), reference(config)[1])
    assert len(dead_letters(settings)) == len(forged)


POISON = {
    "plain text": b"hello, worker",
    "binary": bytes(range(256)),
    "a bare number": b"42",
    "bad base64": json.dumps(
        {
            "body": "%%% not base64 %%%",
            "content-type": "application/json",
            "content-encoding": "utf-8",
            "headers": {"task": TRAIN_DEVICE, "id": "poison-1"},
            "properties": {"body_encoding": "base64", "delivery_tag": "poison-1", "delivery_info": {}},
        }
    ).encode(),
    "no envelope fields": json.dumps({"hello": "world"}).encode(),
}


def test_poison_bytes_are_dead_lettered_once_and_the_worker_keeps_running(settings: Settings, tmp_path: Path) -> None:
    config = small_config(rounds=2)
    logs = tmp_path / "logs"
    with running_workers(settings, procs=1, log_dir=logs) as group:
        pids = [process.pid for process in group.processes]
        for raw in POISON.values():
            push_raw_first(settings, raw)
        wait_until(lambda: len(dead_letters(settings)) >= len(POISON), 60)
        services = open_client_services(settings)
        run_id = submit_run(services, config)
        wait_finished(services.store, run_id, 120)
        assert [process.pid for process in group.processes] == pids
        assert all(process.poll() is None for process in group.processes)
    assert_same_weights(final_state(services.store, run_id), reference_final_state(config))
    refused = dead_letters(settings)
    assert len(refused) == len(POISON), refused
    assert "Unrecoverable error" not in worker_log(logs)
    assert _client(settings).llen(_queue_key(settings)) == 0
    shown = fedqueue_cli("status", cwd=tmp_path, env=cli_env(settings), timeout=60)
    assert shown.returncode == 0 and f"dead letters: {len(POISON)} messages refused for good" in shown.stdout
    as_json = json.loads(fedqueue_cli("status", "--json", cwd=tmp_path, env=cli_env(settings), timeout=60).stdout)
    assert as_json["dead_letters"] == len(POISON) and len(as_json["latest"]) == 5


def test_signed_deployments_refuse_unsigned_and_mis_signed_tasks(settings: Settings, tmp_path: Path) -> None:
    signed = dataclasses.replace(settings, message_key="a-secret-of-the-deployment")
    config = small_config(rounds=2)
    services = open_client_services(signed)
    run_id = submit_run(services, config)
    copy = first_task(services, run_id, config).to_dict()  # the scheduler's own work, not signed by it
    push_first(signed, copy)
    push_first(signed, copy, signature=sign("another-secret-entirely", TRAIN_DEVICE, copy))
    push_first(signed, {**copy, "round_size": 1}, signature=sign(signed.message_key or "", TRAIN_DEVICE, copy))
    with running_workers(signed, procs=1, log_dir=tmp_path / "logs"):
        wait_finished(services.store, run_id, 120)
    assert services.store.get_run(run_id).state == "finished"
    assert_same_weights(final_state(services.store, run_id), reference_final_state(config))
    refused = dead_letters(signed)
    assert len(refused) == 3 and all("not signed with this deployment's" in line for line in refused), refused
