"""The submit's torch work done by a running worker (fl/submit/prepare.py `prepare_on_worker`, fedqueue.queue.ask):
the same version 0 and packing as prepared here, on a real Redis with real worker processes; a worker that
cannot answer, or a question no worker may take, leaves the work to the asker."""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from fedqueue.config import Settings
from fedqueue.core.broker import keys
from fedqueue.core.broker.dead_letters import recent_dead_letters
from fedqueue.core.jobs import CONTROL_QUEUE
from fedqueue.core.services import Services
from fedqueue.fl.scheduler import submit_run
from fedqueue.fl.submit import prepare as preparing
from fedqueue.fl.submit.prepare import prepare, prepare_on_worker
from fedqueue.queue.client import open_client_services
from tests.conftest import running_workers
from tests.support.helpers import small_config
from tests.support.reliability_support import wait_until

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "plugins"
TAKE_WITHIN_S = 60.0  # generous: a worker of a loaded machine may still be in its warm-up
SLOTS = {"worker@a": 2}


@contextlib.contextmanager
def client_services(settings: Settings, ask_within_s: float = TAKE_WITHIN_S) -> Iterator[Services]:
    """A submitting process's services, whose questions wait `ask_within_s` for a worker to take them."""
    services = open_client_services(settings, worker_slots=lambda: SLOTS, ask_within_s=ask_within_s)
    try:
        yield services
    finally:
        services.close()


def test_a_running_worker_prepares_the_same_run_as_here_and_a_submit_spawns_nothing(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    def spawned(*_args: object) -> None:
        raise AssertionError("prepared in a process of its own, with a worker running")

    config = small_config(pack_size="auto", pack_mode="sequential", num_devices=40, devices_per_round=8)
    with running_workers(settings, procs=1), client_services(settings) as services:
        on_worker = prepare_on_worker(services.ask_workers, config, lambda: SLOTS)
        monkeypatch.setattr(preparing, "prepare_apart", spawned)
        run_id = submit_run(services, small_config(num_devices=10, devices_per_round=4, rounds=1), apart=True)
        assert services.store.get_run(run_id).state in ("running", "finished")
    here = prepare(config, lambda: SLOTS)
    assert on_worker is not None
    assert hashlib.sha256(on_worker.state).digest() == hashlib.sha256(here.state).digest()
    assert on_worker.config.to_dict() == here.config.to_dict()  # the packing too: sized for the slots sent


def test_a_plugin_that_fails_on_the_worker_is_prepared_here_with_its_own_error(settings: Settings) -> None:
    from fedqueue.errors import ConfigError

    plugins = settings.with_plugin_path([str(EXAMPLES)])
    config = small_config(local_step="fedqueue_examples.fedprox:fedprox_step", plugin={"mu": -1})
    with running_workers(plugins, procs=1), client_services(plugins) as services:
        assert prepare_on_worker(services.ask_workers, config, lambda: SLOTS) is None
        with pytest.raises(ConfigError, match="^plugin: mu must be"):
            submit_run(services, config, apart=True)


def test_no_worker_to_ask_leaves_the_work_here_and_nothing_on_the_queue(settings: Settings) -> None:
    with client_services(settings, 0.5) as services:
        assert prepare_on_worker(services.ask_workers, small_config(), lambda: SLOTS) is None
    # A question left queued would tell the next command that no worker reads the control queue.
    client = redis.Redis.from_url(settings.broker_url or "")
    assert client.llen(keys.queue_list(settings.key_prefix, settings.queue(CONTROL_QUEUE))) == 0


@pytest.mark.faults
def test_an_unsigned_question_is_dead_lettered_and_never_answered(settings: Settings) -> None:
    signing = dataclasses.replace(settings, message_key="the deployment's secret")
    forger = dataclasses.replace(settings, message_key="another secret")
    with running_workers(signing, procs=1):
        with client_services(forger, 5.0) as services:
            # The worker refuses it: nobody takes it, and the asker stops waiting when it expires.
            assert prepare_on_worker(services.ask_workers, small_config(), lambda: SLOTS) is None
        client = redis.Redis.from_url(settings.broker_url or "")
        wait_until(lambda: recent_dead_letters(client, settings.key_prefix)[0] > 0, timeout_s=60)
        _, letters = recent_dead_letters(client, settings.key_prefix, last=10)
    assert [letter.why for letter in letters] == [
        "fedqueue.fl.prepare: unsigned, or not signed with this deployment's FEDQUEUE_MESSAGE_KEY"
    ]
