"""Shared pieces of the reliability tests: slow configs, worker launchers, a scheduler loop, a broker to stop."""

from __future__ import annotations

import contextlib
import re
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import psutil
import pytest

from fedqueue.config import Settings
from fedqueue.fl import api
from fedqueue.fl.config import RunConfig
from fedqueue.fl.store.results import device_tasks, has_result, list_rounds
from fedqueue.queue.app import make_app
from fedqueue.queue.embedded import EmbeddedRedis
from tests.support.cli_inputs import cli_env
from tests.support.cli_runner import start_fedqueue_cli
from tests.support.helpers import small_config

PLUGINS = Path(__file__).with_name("plugin_modules")
SLOW_STEP = "fq_reliability:slow_step"


def reliable_settings(settings: Settings, **changes: Any) -> Settings:
    """Short heartbeats and leases, so lost work is noticed within seconds; `changes` may set them too."""
    return replace(settings.with_plugin_path([str(PLUGINS)]), **{"heartbeat_ttl_s": 3, "lease_ttl_s": 3, **changes})


def slow_config(step_sleep: float, **overrides: Any) -> RunConfig:
    """Each local step pauses `step_sleep` seconds; the training itself is the built-in one."""
    return small_config(local_step=SLOW_STEP, plugin={"step_sleep": step_sleep}, **overrides)


def wait_until(predicate: Callable[[], bool], timeout_s: float, tick: Callable[[], object] | None = None) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not reached within {timeout_s} s")
        if tick is not None:
            tick()
        time.sleep(0.1)


def ping_count(settings: Settings) -> int:
    app = make_app(settings)
    try:
        return len(app.control.ping(timeout=0.5) or [])
    finally:
        app.close()


@contextlib.contextmanager
def launcher(settings: Settings, procs: int, cwd: Path) -> Iterator[subprocess.Popen[str]]:
    """`fedqueue worker --procs N` as a user starts it; stopped (and reaped) at the end."""
    log = open(cwd / f"launcher-{time.monotonic_ns()}.log", "w")  # noqa: SIM115 - closed when the launcher stops
    process = start_fedqueue_cli(
        "worker", "--procs", str(procs), cwd=cwd, env=cli_env(settings), stdout=log, stderr=subprocess.STDOUT
    )
    try:
        wait_until(lambda: ping_count(settings) >= procs, 90)
        yield process
    finally:
        stop_launcher(process)
        log.close()


def stop_launcher(process: subprocess.Popen[str]) -> None:
    """SIGTERM a launcher (its workers finish their tasks), SIGKILL its tree if it takes over a minute; reap it."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            kill_tree(process.pid)
            process.wait()


def worker_children(process: subprocess.Popen[str]) -> list[psutil.Process]:
    return [child for child in psutil.Process(process.pid).children() if child.is_running()]


def kill_tree(pid: int) -> None:
    """SIGKILL a process and every descendant at once, as a machine that loses power."""
    root = psutil.Process(pid)
    for process in [*root.children(recursive=True), root]:
        with contextlib.suppress(psutil.NoSuchProcess):
            process.kill()


def running_worker(handle: api.RunHandle, round_index: int, devices: list[int]) -> tuple[int, str] | None:
    """A (device, worker hostname) currently running, read from the heartbeat keys.

    A finished task's mark lingers until it expires, so devices with a stored result are skipped.
    """
    from fedqueue.core.services import connect_redis

    client = connect_redis(handle.settings.broker_url or "")
    try:
        for device in devices:
            if has_result(handle.store, handle.id, round_index, device):
                continue
            value = client.get(f"{handle.settings.key_prefix}:running:{handle.id}:{round_index}:{device}")
            if value:
                assert isinstance(value, bytes)  # connect_redis's client does not decode replies
                return device, value.decode()
    finally:
        client.close()
    return None


def wait_for_running(
    handle: api.RunHandle, round_index: int, devices: list[int], tick: Callable[[], object] | None = None
) -> tuple[int, str]:
    """Block until one of `devices` is running; return it and its worker's hostname."""
    wait_until(lambda: running_worker(handle, round_index, devices) is not None, 60, tick)
    found = running_worker(handle, round_index, devices)
    assert found is not None
    return found


def pid_of_worker(process: subprocess.Popen[str], hostname: str) -> int:
    name = hostname.split("@")[0]
    for child in worker_children(process):
        if f"{name}@%h" in " ".join(child.cmdline()):
            return child.pid
    raise AssertionError(f"no worker process named {name}")


def update_blob_keys(settings: Settings, run_id: str) -> list[str]:
    """Update blobs of a run still in the Redis blob store (workers upload each result as one)."""
    from fedqueue.core.services import connect_redis

    assert settings.blob_dir is None, "the blobs of this test live in Redis"
    client = connect_redis(settings.broker_url or "")
    try:
        return sorted(key.decode() for key in client.scan_iter(match=f"{settings.key_prefix}:blob:{run_id}/update/*"))
    finally:
        client.close()


def deliveries_settled(settings: Settings, task_keys: list[str], workers: int) -> bool:
    """No delivery of any task is queued, delivered-but-unacknowledged, reserved or running on any worker.

    Reads what Redis holds (both queues, the unacked hash, fedqueue's running marks) and what each
    Celery worker says it holds: a delivery that was redelivered is in none of Redis's lists but
    still runs, and only its worker (or its running mark) shows it.
    """
    from fedqueue.core.services import connect_redis
    from fedqueue.fl.messages import DEVICES_QUEUE

    prefix = settings.key_prefix
    client = connect_redis(settings.broker_url or "")
    try:
        queued = sum(int(client.llen(f"{prefix}:{settings.queue(q)}")) for q in ("control", DEVICES_QUEUE))
        unacked = int(client.hlen(f"{prefix}:unacked"))
        running = sum(int(client.exists(f"{prefix}:running:{key}")) for key in task_keys)
    finally:
        client.close()
    if queued or unacked or running:
        return False
    app = make_app(settings)
    try:
        inspect = app.control.inspect(timeout=1.0, limit=workers)
        active, reserved = inspect.active() or {}, inspect.reserved() or {}
    finally:
        app.close()
    return len(active) == workers and not any(active.values()) and not any(reserved.values())


def wait_settled(settings: Settings, task_keys: list[str], workers: int, timeout_s: float = 60) -> None:
    """Block until `deliveries_settled` holds twice in a row (a message between BRPOP and the unacked hash)."""
    seen = [False]

    def twice() -> bool:
        now = deliveries_settled(settings, task_keys, workers)
        settled, seen[0] = now and seen[0], now
        return settled

    wait_until(twice, timeout_s)


def train_finished_at(store: Any, run_id: str, round_index: int) -> list[float]:
    """finished_at of every stored device (train) task of a round."""
    return [t.finished_at for t in store.task_timings(run_id, round_index) if t.task_type == "train"]


def one_result_per_device(handle: api.RunHandle) -> None:
    """Every round stored exactly its selected devices, each once."""
    for row in list_rounds(handle.store, handle.id):
        devices = [task.device for task in device_tasks(handle.store, handle.id, row.round_index)]
        assert sorted(devices) == sorted(row.selected), f"round {row.round_index}: {devices} vs {row.selected}"


# What a follower prints when the broker goes, and when it is back (fedqueue.core.waits.outage).
BROKER_WENT = "broker unreachable ("
BROKER_BACK = "broker back after "


def bounce_broker(broker: EmbeddedRedis, follower: subprocess.Popen[str], log: Path) -> EmbeddedRedis:
    """Stop the broker under a live follower, wait for its line, start the broker again (empty) on its port."""
    broker.stop()
    wait_until(lambda: BROKER_WENT in log.read_text() or follower.poll() is not None, 30)
    assert follower.poll() is None, log.read_text()[-3000:]
    return EmbeddedRedis(port=broker.port).start()


def followed_through_the_outage(follower: subprocess.Popen[str], log: Path) -> str:
    """A follower's output once it ended: exit 0, the broker's going and coming back said once each, no traceback."""
    output = log.read_text()
    assert follower.returncode == 0, output[-3000:]
    assert output.count(BROKER_WENT) == 1 and output.count(BROKER_BACK) == 1, output[-3000:]
    assert "Traceback" not in output, output[-3000:]
    return output


def start_follower(cwd: Path, env: dict[str, str], *args: str) -> tuple[subprocess.Popen[str], Path]:
    """`fedqueue *args` (a command that follows its run) started, its stdout and stderr in one file read as it runs."""
    log = cwd / f"follower-{time.monotonic_ns()}.log"
    with log.open("w") as out:
        process = start_fedqueue_cli(*args, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT)
    return process, log


def printed_run_id(process: subprocess.Popen[str], log: Path, timeout_s: float = 90) -> str:
    """The run (or job) id a follower printed when it submitted; fails if it ended first."""
    pattern = re.compile(r"\b(?:run|job) ([0-9A-Za-z_.-]+) (?:submitted|continued)")
    wait_until(lambda: pattern.search(log.read_text()) is not None or process.poll() is not None, timeout_s)
    found = pattern.search(log.read_text())
    assert found is not None, log.read_text()[-3000:]
    return found.group(1)


def stop_process(process: subprocess.Popen[str]) -> None:
    """A follower still running when its test ends: killed and reaped."""
    if process.poll() is None:
        kill_tree(process.pid)
        process.wait()


# How a follower is started: given its folder, its environment and its arguments (start_follower's form).
Starter = Callable[..., tuple[subprocess.Popen[str], Path]]


class BrokerOutage:
    """A Redis of the test's own, stopped and started again (empty) on its port under a follower; `settings` on it.
    The followers and brokers it started are stopped when the test ends (the `broker_outage` fixture)."""

    def __init__(self, settings: Settings, cwd: Path) -> None:
        self.cwd = cwd
        self.broker = EmbeddedRedis().start()
        self.settings = reliable_settings(replace(settings, broker_url=self.broker.url))
        self._servers = [self.broker]
        self._followers: list[subprocess.Popen[str]] = []

    def follow(self, *args: str, start: Starter = start_follower) -> tuple[subprocess.Popen[str], Path]:
        """`fedqueue *args` on this broker (`start`: how), its output in one file."""
        follower, log = start(self.cwd, cli_env(self.settings), *args)
        self._followers.append(follower)
        return follower, log

    def bounce(self, follower: subprocess.Popen[str], log: Path) -> None:
        """The broker stopped under a live follower and, once it said so, started again (empty) on its port."""
        self._servers.append(bounce_broker(self.broker, follower, log))

    def start_again(self) -> None:
        """The stopped broker started again (empty) on its port."""
        self._servers.append(EmbeddedRedis(port=self.broker.port).start())

    def close(self) -> None:
        for follower in self._followers:
            stop_process(follower)
        for server in self._servers:
            server.stop()


@pytest.fixture(name="broker_outage")
def broker_outage_fixture(settings: Settings, tmp_path: Path) -> Iterator[BrokerOutage]:
    """A broker of the test's own to stop and start again (import this where it is used: it is no conftest's)."""
    outage = BrokerOutage(settings, tmp_path)
    try:
        yield outage
    finally:
        outage.close()
