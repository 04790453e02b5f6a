"""Hostile and broken input: configs, queue messages, pickles. Refused in one line, never executed."""

from __future__ import annotations

from pathlib import Path

import redis
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from fedqueue.config import Settings
from fedqueue.core.broker.dead_letters import recent_dead_letters
from fedqueue.errors import ConfigError, DataError
from fedqueue.fl import api
from fedqueue.fl.config import RunConfig, load_run_config
from fedqueue.fl.kind import TRAIN_DEVICE
from fedqueue.queue.app import make_app
from tests.conftest import running_workers
from tests.support.cli_inputs import cli_env
from tests.support.cli_runner import fedqueue_cli
from tests.support.helpers import small_config
from tests.support.reliability_support import wait_until

KNOWN = [f for f in RunConfig.__dataclass_fields__]
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(10**6), 10**6) | st.floats(allow_nan=True) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=5), children, max_size=3),
    max_leaves=6,
)


@hypothesis_settings(max_examples=400, deadline=None)
@given(st.dictionaries(st.sampled_from([*KNOWN, "bogus", "Rounds", ""]), json_values, max_size=6))
def test_any_config_is_accepted_or_refused_naming_a_field(raw: dict) -> None:
    try:
        RunConfig.from_dict(raw)
    except (ConfigError, DataError) as err:
        message = str(err)
        assert "\n" not in message
        field = message.split(":")[0].split(".")[0]  # a table's setting is named as table.setting
        # Fields whose default a field set beside them can rule out (buffer_size: its 10 beside concurrency = 5).
        implied = {"local_iters", "devices_per_round", "min_devices_per_round", "data_root", "buffer_size"}
        assert field in raw or field in implied


@hypothesis_settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.text(max_size=200))
def test_any_toml_text_is_accepted_or_refused_in_one_line(tmp_path: Path, text: str) -> None:
    path = tmp_path / "run.toml"
    path.write_text(text, encoding="utf-8")
    try:
        load_run_config(path)
    except (ConfigError, DataError) as err:
        assert str(err).strip() and "\n" not in str(err).strip()


def test_refused_submit_leaves_nothing_in_store_or_queue(settings: Settings, tmp_path: Path) -> None:
    config = tmp_path / "run.toml"
    config.write_text("num_devices = 5\ndevices_per_round = 9\n")
    result = fedqueue_cli("submit", str(config), cwd=tmp_path, env=cli_env(settings), timeout=60)
    assert result.returncode == 2 and "devices_per_round" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    client = redis.Redis.from_url(settings.broker_url or "")
    assert list(client.scan_iter(match=f"{settings.key_prefix}*")) == []
    assert not Path(settings.database_url.removeprefix("sqlite:///")).exists()


class _OpensAFile:
    """Unpickling this would create a file: proof that a pickle was (or was not) loaded."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple:
        return (open, (self.path, "w"))


def test_malformed_unknown_and_pickled_messages_are_refused(settings: Settings, tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    marker = tmp_path / "unpickled"
    with running_workers(settings, procs=1, log_dir=logs):
        app = make_app(settings)
        try:
            queue = settings.queue("devices")
            app.send_task("fedqueue.no_such_task", args=[{}], queue=queue)
            app.send_task(TRAIN_DEVICE, args=[{"run_id": "r", "bogus": 1}], queue=queue)
            app.send_task(TRAIN_DEVICE, args=["not an object"], queue=queue)
            app.conf.accept_content = ["json", "pickle"]  # only the sender is tricked into sending it
            app.send_task(TRAIN_DEVICE, args=[_OpensAFile(str(marker))], queue=queue, serializer="pickle")
            with app.connection_for_write() as connection:
                connection.default_channel.basic_publish(
                    connection.default_channel.prepare_message(
                        b"{not json",
                        content_type="application/json",
                        content_encoding="utf-8",
                        headers={"task": TRAIN_DEVICE, "id": "bad-json-1"},
                    ),
                    exchange=queue,
                    routing_key=queue,
                )
        finally:
            app.close()

        def worker_log() -> str:
            return "".join(path.read_text() for path in logs.glob("*.log"))

        wait_until(lambda: "Can't decode message body" in worker_log(), 30)
        log_text = worker_log()
        assert "Received unregistered task of type 'fedqueue.no_such_task'" in log_text
        assert "rejected malformed task message: task: unknown field 'bogus'" in log_text
        assert "rejected malformed task message: task: expected a JSON object, got str" in log_text
        assert "Refusing to deserialize untrusted content of type pickle" in log_text
        # The worker survived all of it and still trains.
        status = api.submit(small_config(rounds=1, devices_per_round=2), settings=settings).wait(60)
    assert status["state"] == "finished" and status["tasks_done"] == 2
    assert not marker.exists()  # the pickle was never loaded
    client = redis.Redis.from_url(settings.broker_url or "")
    assert client.llen(f"{settings.key_prefix}:{settings.queue('devices')}") == 0  # nothing bounced back
    count, records = recent_dead_letters(client, settings.key_prefix, last=10)
    assert count == 5, records  # each refused message dead-lettered once
