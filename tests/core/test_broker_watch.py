"""fedqueue.core.waits.outage on a real Redis of its own, stopped and started again: the lines, the fallback, the limit."""

from __future__ import annotations

from pathlib import Path
from typing import cast

import pytest
import redis
from kombu.exceptions import OperationalError
from redis.backoff import NoBackoff
from redis.retry import Retry

from fedqueue.api import Placement, submit_through_outage
from fedqueue.config import Settings
from fedqueue.core.database import open_store
from fedqueue.core.services import Services
from fedqueue.core.waits.outage import BrokerGone, BrokerWatch, SubmitCutShort, is_broker_error, ping_probe, run_stored
from fedqueue.queue.embedded import EmbeddedRedis
from tests.support.cli_inputs import cli_env
from tests.support.cli_runner import fedqueue_cli


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


# Services handed to submit_through_outage so that it opens none of its own; _Submission never reads them.
UNUSED_SERVICES = cast(Services, object())


class _Submission:
    """A submission whose submit fails as `outcomes` say, in turn (an exception), or returns a run id."""

    def __init__(self, *outcomes: BaseException | str) -> None:
        self.outcomes = list(outcomes)
        self.calls = 0

    def check(self, settings: Settings) -> None:
        pass

    def submit(self, services: object) -> str:
        self.calls += 1
        outcome = self.outcomes.pop(0)
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome


def test_a_submit_cut_short_before_its_run_is_stored_waits_for_the_broker_and_starts_again() -> None:
    server = EmbeddedRedis().start()
    lines: list[str] = []
    submission = _Submission(redis.ConnectionError("Connection refused"), "r1")
    try:
        handle = submit_through_outage(
            submission, Placement(Settings(broker_url=server.url)), UNUSED_SERVICES, lines.append
        )
    finally:
        server.stop()
    assert (handle.id, handle.submit_cut, submission.calls) == ("r1", None, 2)
    assert lines[0] == "broker unreachable (Connection refused): waiting for it; nothing of the run is stored yet"
    assert lines[1].startswith("broker back after ") and lines[1].endswith(" s: submitting again")


def test_a_submit_cut_short_after_its_run_is_stored_hands_the_run_to_its_follower_waiting() -> None:
    lost = redis.ConnectionError("Connection refused")
    place = Placement(Settings(broker_url="redis://127.0.0.1:1/0"))
    handle = submit_through_outage(_Submission(SubmitCutShort("r2", lost)), place, UNUSED_SERVICES)
    assert (handle.id, handle.submit_cut) == ("r2", lost)  # `scheduling` starts its broker watch down
    with pytest.raises(ValueError, match="not the broker"):
        submit_through_outage(_Submission(ValueError("not the broker")), place, UNUSED_SERVICES)


def test_a_run_stored_before_the_broker_failed_is_named_by_its_error() -> None:
    with pytest.raises(SubmitCutShort) as cut, run_stored("r3"):
        raise redis.ConnectionError("Connection refused")
    assert cut.value.run_id == "r3" and cut.value.exit_code == 1  # `fedqueue submit`: it failed at run time
    assert str(cut.value).startswith("broker unreachable (Connection refused) while run r3 was submitted: the run is")
    with pytest.raises(KeyError), run_stored("r3"):  # not the broker's fault: as it is
        raise KeyError("x")


def test_resume_with_a_broker_url_that_is_not_redis_is_one_line(tmp_path: Path) -> None:
    """`resume` waits for its broker before anything else (fedqueue.core.waits.outage.wait_for_broker): a URL that names
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
