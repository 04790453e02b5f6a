"""fedqueue.core.outage on a real Redis of its own, stopped and started again: the lines, the fallback, the limit."""

from __future__ import annotations

from pathlib import Path

import pytest
import redis
from kombu.exceptions import OperationalError
from redis.backoff import NoBackoff
from redis.retry import Retry

from fedqueue.core.database import open_store
from fedqueue.core.outage import BrokerGone, BrokerWatch, is_broker_error, ping_probe
from fedqueue.queue.embedded import EmbeddedRedis
from tests.cli_runner import fedqueue_cli
from tests.test_cli import cli_env


def test_a_watch_says_once_each_way_falls_back_meanwhile_and_gives_up_after_its_wait() -> None:
    first = EmbeddedRedis().start()
    second = None
    now = [0.0]
    lines: list[str] = []
    watch = BrokerWatch("r1", 10, ping_probe(first.url), lines.append, clock=lambda: now[0])
    client = redis.Redis.from_url(first.url, retry=Retry(NoBackoff(), 0))

    def step() -> int:
        return int(client.incr("count"))

    def fallback() -> int:
        return -1

    try:
        assert watch.call(step, fallback) == 1
        first.stop()
        assert watch.call(step, fallback) == -1
        assert watch.down
        assert len(lines) == 1
        assert lines[0].startswith("broker unreachable (")
        assert lines[0].endswith("): waiting for it; the workers keep their tasks")
        now[0] = 4.0
        assert watch.call(step, fallback) == -1  # probed again: still down, nothing more said
        assert len(lines) == 1
        second = EmbeddedRedis(port=first.port).start()
        now[0] = 6.0
        assert watch.call(step, fallback) == 1  # back, and empty: the step runs again at once
        assert lines[1:] == ["broker back after 6 s: run r1 goes on"]
        assert not watch.down
        second.stop()
        assert watch.call(step, fallback) == -1
        assert len(lines) == 3
        now[0] = 16.0
        with pytest.raises(
            BrokerGone, match=r"run r1 continues when its workers and broker are back: `fedqueue resume r1`"
        ):
            watch.call(step, fallback)
    finally:
        client.close()
        for server in (first, second):
            if server is not None:
                server.stop()


def test_other_errors_pass_through_the_watch() -> None:
    watch = BrokerWatch("r1", 10, lambda: None, lambda line: None)

    def broken() -> None:
        raise ValueError("not the broker")

    with pytest.raises(ValueError, match="not the broker"):
        watch.call(broken, lambda: None)
    assert not watch.down


def test_broker_errors_are_told_through_their_causes() -> None:
    assert is_broker_error(redis.ConnectionError("refused"))
    assert is_broker_error(redis.TimeoutError("timed out"))
    assert is_broker_error(OperationalError("publish failed"))  # Celery's, when a publish finds no broker
    try:
        try:
            raise redis.ConnectionError("refused")
        except redis.ConnectionError as err:
            raise RuntimeError("repair failed") from err
    except RuntimeError as wrapped:
        assert is_broker_error(wrapped)
    assert not is_broker_error(RuntimeError("repair failed"))
    assert not is_broker_error(redis.ResponseError("WRONGTYPE"))


def test_resume_with_a_broker_url_that_is_not_redis_is_one_line(tmp_path: Path) -> None:
    """`resume` waits for its broker before anything else (fedqueue.core.outage.wait_for_broker): a URL that names
    no Redis is still refused in one line, not waited for nor a traceback."""
    database = f"sqlite:///{tmp_path / 'store.db'}"
    store = open_store(database, migrate=True)
    store.create_run("run-a", "a run", {}, 1, kind="fl")
    store.close()
    result = fedqueue_cli(
        "resume", "run-a", env=cli_env(FEDQUEUE_BROKER_URL="http://x", FEDQUEUE_DATABASE_URL=database), cwd=tmp_path
    )
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stderr == "error: FEDQUEUE_BROKER_URL: expected a redis:// URL, got http://x\n", result.stderr
