"""docker-compose.yml brought up for real: the images `make images` builds, containers the Docker engine runs.

The cpu profile with two worker containers: worker-cpu (host1) and a copy of it that plays a
second host (host2, from an override file). The demo runs through the cli service and must reach
the demo's accuracy; Flower is read through its published port; then faults through the engine:
worker containers killed mid-run, `docker-compose stop` during a task, Redis recreated on its volume.

Several minutes, so not part of `make test`: `make test-deploy` runs it (`pytest -m deploy`), and it
skips, saying why, without Docker, docker-compose or the images. Each run is its own compose project
(its own network and volumes, all removed at the end), published on a loopback address of its own
(127.x.y.z), so Redis and Postgres already listening on 127.0.0.1 keep their ports.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import random
import re
import secrets
import shutil
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import pytest
import redis
import torch
import yaml

from fedqueue.core.database import open_store
from fedqueue.fl.store.results import device_tasks, list_rounds
from tests.support.helpers import assert_same_weights
from tests.support.reliability_support import wait_until
from tests.support.service_support import http_get, redis_answers

pytestmark = [pytest.mark.deploy, pytest.mark.timeout(1200)]

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILE = ROOT / "docker-compose.yml"
TAG = os.environ.get("FEDQUEUE_IMAGES_TAG", "bookworm")
IMAGES = (f"fedqueue:{TAG}", f"fedqueue-redis:{TAG}", f"fedqueue-postgres:{TAG}")
DEMO = "examples/digits_fedavg.toml"
DEMO_ACCURACY = 0.9331  # what `make demo` prints (README)
WORKERS = {"cpu0@host1", "cpu0@host2"}
GRACE_S = 120  # FEDQUEUE_TASK_TIME_LIMIT_S, and so the workers' stop_grace_period


def _skip_reason(config: pytest.Config) -> str | None:
    if "deploy" not in (config.getoption("markexpr", "") or ""):
        return "the compose deployment takes minutes: run it with `make test-deploy` (pytest -m deploy)"
    for tool, package in (("docker", "docker.io"), ("docker-compose", "docker-compose")):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (Debian's {package}; `make images` installs it)"
    if subprocess.run(["docker", "info"], capture_output=True, timeout=60).returncode != 0:
        return "no Docker engine answers (`make images` starts dockerd)"
    missing = [
        image
        for image in IMAGES
        if subprocess.run(["docker", "image", "inspect", image], capture_output=True, timeout=60).returncode != 0
    ]
    if missing:
        return f"images missing: {', '.join(missing)} (build them with `make images`)"
    return None


def _loopback_address() -> str:
    """A 127.x.y.z of this run's own where ports 6379, 5432 and 5555 are free."""
    for _ in range(50):
        address = f"127.{random.randint(1, 254)}.{random.randint(1, 254)}.{random.randint(2, 254)}"
        try:
            for port in (6379, 5432, 5555):
                with socket.socket() as sock:
                    sock.bind((address, port))
        except OSError:
            continue
        return address
    raise AssertionError("no loopback address with ports 6379, 5432 and 5555 free")


@dataclass
class Stack:
    """One compose project: its commands, its containers, and clients for what it publishes."""

    project: str
    folder: Path
    address: str
    env: dict[str, str]
    log: list[str] = field(default_factory=list)

    @property
    def base(self) -> list[str]:
        second = self.folder / "second-worker.yml"
        return [
            "docker-compose",
            "--project-name",
            self.project,
            "--project-directory",
            str(self.folder),
            "--env-file",
            str(self.folder / ".env"),
            "-f",
            str(COMPOSE_FILE),
            *(["-f", str(second)] if second.exists() else []),
            "--profile",
            "cpu",
        ]

    def compose(self, *args: str, timeout: float = 300, check: bool = True) -> subprocess.CompletedProcess[str]:
        # Only what compose needs: this shell's FEDQUEUE_* variables must not reach the project.
        env = {key: value for key, value in os.environ.items() if key in ("PATH", "HOME", "DOCKER_HOST")}
        started = time.monotonic()
        done = subprocess.run([*self.base, *args], capture_output=True, text=True, timeout=timeout, env=env)
        self.log.append(f"docker-compose {' '.join(args)}: rc {done.returncode}, {time.monotonic() - started:.1f} s")
        if check:
            assert done.returncode == 0, f"docker-compose {' '.join(args)}:\n{done.stdout[-3000:]}{done.stderr[-3000:]}"
        return done

    def cli(self, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        """`docker-compose run --rm cli ...`, as the README runs the CLI."""
        return self.compose("run", "--rm", "-T", "cli", *args, timeout=timeout, check=False)

    def container(self, service: str) -> str:
        ids = self.compose("ps", "-q", service).stdout.split()
        assert len(ids) == 1, f"{service}: containers {ids}"
        return ids[0]

    def containers(self) -> list[str]:
        listed = subprocess.run(
            ["docker", "ps", "-aq", "--filter", f"label=com.docker.compose.project={self.project}"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        return listed.stdout.split()

    def inspect(self, container: str) -> dict[str, Any]:
        found = subprocess.run(["docker", "inspect", container], capture_output=True, text=True, timeout=60)
        assert found.returncode == 0, found.stderr
        return dict(json.loads(found.stdout)[0])

    def logs(self, service: str) -> str:
        return self.compose("logs", "--no-color", "--tail", "60", service, check=False).stdout

    def database_url(self) -> str:
        return f"postgresql+psycopg://fedqueue:{self.env['POSTGRES_PASSWORD']}@{self.address}:5432/fedqueue"

    def redis(self) -> redis.Redis:
        return redis.Redis(host=self.address, port=6379, password=self.env["REDIS_PASSWORD"], socket_timeout=10)

    def flower(self, path: str, auth: bool = True) -> tuple[int, Any]:
        user, _, password = self.env["FLOWER_BASIC_AUTH"].partition(":")
        return http_get(f"http://{self.address}:5555{path}", (user, password) if auth else None)

    def flower_workers(self) -> dict[str, Any]:
        status, workers = self.flower("/api/workers?refresh=1")
        return dict(workers) if status == 200 and isinstance(workers, dict) else {}

    def secrets(self) -> list[str]:
        return [self.env["REDIS_PASSWORD"], self.env["POSTGRES_PASSWORD"], self.env["FLOWER_BASIC_AUTH"].split(":")[1]]


def _remove(stack: Stack) -> None:
    """Everything the project made: containers, one-off ones included, its network and its volumes."""
    stack.compose("--profile", "cli", "down", "--volumes", "--remove-orphans", "--timeout", "10", check=False)
    label = f"label=com.docker.compose.project={stack.project}"
    for kind in ("container", "volume", "network"):
        listed = subprocess.run(
            ["docker", kind, "ls", "-q", *(["-a"] if kind == "container" else []), "--filter", label],
            capture_output=True,
            text=True,
            timeout=60,
        )
        for name in listed.stdout.split():
            subprocess.run(["docker", kind, "rm", *(["-f"] if kind != "network" else []), name], capture_output=True)


def _second_worker(stack: Stack) -> None:
    """worker-cpu-2: worker-cpu as compose resolves it, on another host name (host2), as a second
    host would run it (README, "A second worker host"). Compose cannot `extends` a service with depends_on."""
    resolved = yaml.safe_load(stack.compose("config").stdout)
    worker = resolved["services"]["worker-cpu"]
    worker["hostname"] = "host2"
    path = stack.folder / "second-worker.yml"
    path.touch(mode=0o600)  # the resolved service holds the passwords of its environment
    path.write_text(yaml.safe_dump({"services": {"worker-cpu-2": worker}}))


@pytest.fixture(scope="module")
def stack(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    reason = _skip_reason(request.config)
    if reason is not None:
        pytest.skip(reason)
    folder = tmp_path_factory.mktemp("compose")
    address = _loopback_address()
    env = {
        "FEDQUEUE_HOSTNAME": "host1",
        "REDIS_PASSWORD": f"redis-{secrets.token_hex(12)}",
        "POSTGRES_PASSWORD": f"postgres-{secrets.token_hex(12)}",
        "FLOWER_BASIC_AUTH": f"admin:flower-{secrets.token_hex(12)}",
        "FLOWER_ADDRESS": address,
        "FLOWER_PORT": "5555",
        "FEDQUEUE_PUBLISH_ADDRESS": address,
        "FEDQUEUE_TASK_TIME_LIMIT_S": str(GRACE_S),
        "FEDQUEUE_CPU_PROCS": "1",
        "FEDQUEUE_IMAGE_TAG": TAG,
        "FEDQUEUE_BASE_IMAGE": f"fedqueue-python:{TAG}",
        "FEDQUEUE_REDIS_IMAGE": f"fedqueue-redis:{TAG}",
        "FEDQUEUE_POSTGRES_IMAGE": f"fedqueue-postgres:{TAG}",
    }
    (folder / ".env").write_text("".join(f"{key}={value}\n" for key, value in env.items()))
    running = Stack(f"fqdeploy{uuid.uuid4().hex[:10]}", folder, address, env)
    started = time.monotonic()
    try:
        _second_worker(running)
        running.compose("up", "-d", timeout=600)
        wait_until(lambda: set(running.flower_workers()) == WORKERS, 240)
        running.log.append(f"stack up, both workers answering: {time.monotonic() - started:.1f} s")
        yield running
    finally:
        _remove(running)
        print("\n".join(running.log))


@dataclass
class Finished:
    run_id: str
    output: str
    config: dict[str, Any]
    accuracy: float | None
    workers: set[str]
    weights: dict[str, torch.Tensor]
    seconds: float


def _finished(stack: Stack, run_id: str, output: str = "", seconds: float = 0.0) -> Finished:
    from fedqueue.fl.strategy.common import final_state
    from fedqueue.report.summary import run_summary

    store = open_store(stack.database_url())
    try:
        run = store.get_run(run_id)
        assert run.state == "finished", f"run {run_id} is {run.state}: {run.error}"
        summary = run_summary(store, run_id)
        workers = {row.worker for row in device_tasks(store, run_id)}
        return Finished(
            run_id, output, dict(run.config), summary["final_accuracy"], workers, final_state(store, run_id), seconds
        )
    finally:
        store.close()


def _run_state(stack: Stack, run_id: str) -> tuple[str, list[str]]:
    store = open_store(stack.database_url())
    try:
        return store.get_run(run_id).state, [row.state for row in list_rounds(store, run_id)]
    finally:
        store.close()


@pytest.fixture(scope="module")
def demo(stack: Stack) -> Finished:
    """`docker-compose run --rm cli fedqueue run examples/digits_fedavg.toml`, as the README says."""
    started = time.monotonic()
    done = stack.cli("fedqueue", "run", DEMO)
    seconds = time.monotonic() - started
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:] + stack.logs("worker-cpu")
    found = re.search(r"run ([0-9a-f]{12})", output)
    assert found is not None, output[-4000:]
    stack.log.append(f"demo through the cli service: {seconds:.1f} s; it printed:\n{output.strip()}")
    return _finished(stack, found.group(1), output, seconds)


def _submit(stack: Stack, demo: Finished) -> str:
    """The demo submitted again with its packs as the first run resolved them: the same weights are due."""
    done = stack.cli(
        "fedqueue",
        "submit",
        DEMO,
        "--set",
        f"pack_size={demo.config['pack_size']}",
        "--set",
        f"pack_mode={demo.config['pack_mode']}",
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    found = re.findall(r"^([0-9a-f]{12})$", done.stdout, re.MULTILINE)
    assert found, done.stdout[-3000:] + done.stderr[-3000:]
    return str(found[-1])


def _wait_finished(stack: Stack, run_id: str, timeout_s: float) -> None:
    def finished() -> bool:
        state, _ = _run_state(stack, run_id)
        assert state != "failed", f"run {run_id} failed"
        return state == "finished"

    try:
        wait_until(finished, timeout_s)
    except AssertionError:
        raise AssertionError(
            f"run {run_id} {_run_state(stack, run_id)}\n{stack.logs('worker-cpu')}{stack.logs('worker-cpu-2')}"
        ) from None


@contextlib.contextmanager
def _slow_workers(stack: Stack, cpus: float) -> Iterator[list[str]]:
    """The worker containers held to a fraction of a core, so that a round lasts long enough to hit.

    Only the timing changes: each task trains with one thread and its own seed, whatever its speed.
    """
    workers = [stack.container("worker-cpu"), stack.container("worker-cpu-2")]
    subprocess.run(["docker", "update", "--cpus", str(cpus), *workers], check=True, capture_output=True)
    try:
        yield workers
    finally:
        # --cpus cannot be unset: as many as the machine has is no limit.
        unlimited = str(os.cpu_count() or 1)
        for worker in workers:
            subprocess.run(["docker", "update", "--cpus", unlimited, worker], capture_output=True)


def _training(stack: Stack, run_id: str, round_index: int) -> bool:
    """The run has reached round `round_index` or a later one, and that round is training."""
    state, rounds = _run_state(stack, run_id)
    assert state != "finished", f"run {run_id} finished before round {round_index} was caught training"
    return len(rounds) >= round_index and rounds[-1] == "training" and "failed" not in rounds


def _both_workers_back(stack: Stack) -> None:
    wait_until(lambda: set(stack.flower_workers()) == WORKERS, 180)


def test_the_demo_through_the_cli_service_reaches_the_demos_accuracy(stack: Stack, demo: Finished) -> None:
    assert demo.accuracy is not None and round(demo.accuracy, 4) == DEMO_ACCURACY, demo.output[-3000:]
    # Its tasks ran in both worker containers, and nowhere else.
    assert demo.workers == WORKERS
    assert len([line for line in demo.output.splitlines() if "accuracy" in line.lower()]) >= 1


def test_flower_is_published_behind_basic_auth(stack: Stack, demo: Finished) -> None:
    for path in ("/workers", "/api/workers", "/tasks"):
        assert stack.flower(path, auth=False)[0] == 401, path
    assert stack.flower("/workers")[0] == 200
    assert set(stack.flower_workers()) == WORKERS
    status, tasks = stack.flower("/api/tasks?limit=1000")
    assert status == 200 and tasks, "Flower lists no task of the demo"
    assert {task.get("worker") for task in tasks.values()} <= WORKERS


def test_no_secret_on_any_command_line(stack: Stack, demo: Finished) -> None:
    words = stack.secrets()
    containers = stack.containers()
    assert len(containers) >= 5
    for container in containers:
        found = stack.inspect(container)
        config = found["Config"]
        command_lines = json.dumps(
            [found["Path"], found["Args"], config.get("Cmd"), config.get("Entrypoint"), config.get("Healthcheck")]
        )
        assert not [word for word in words if word in command_lines], found["Name"]
    # The secrets do reach the containers, through their environment: Redis's password, say.
    redis_env = stack.inspect(stack.container("redis"))["Config"]["Env"]
    assert f"REDIS_PASSWORD={stack.env['REDIS_PASSWORD']}" in redis_env
    # Nor on the command line of any process the containers run (they are this machine's processes).
    lines = []
    for process in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            lines.append(" ".join(process.cmdline()))
    assert not [line for line in lines if any(word in line for word in words)]
    assert stack.redis().config_get("appendonly")["appendonly"] == "yes"
    with pytest.raises(redis.AuthenticationError):
        redis.Redis(host=stack.address, port=6379).ping()


def test_worker_containers_killed_mid_run_and_the_run_ends_on_the_same_weights(stack: Stack, demo: Finished) -> None:
    with _slow_workers(stack, 0.25) as (first, second):
        run_id = _submit(stack, demo)
        wait_until(lambda: _training(stack, run_id, 3), 300)
        # `docker kill` on one; the other's process killed under the engine (as the kernel's OOM killer would).
        subprocess.run(["docker", "kill", first], check=True, capture_output=True)
        os.kill(int(stack.inspect(second)["State"]["Pid"]), signal.SIGKILL)
        killed_at = time.monotonic()
        # The engine starts the crashed container again by its restart policy (unless-stopped) ...
        wait_until(lambda: stack.inspect(second)["RestartCount"] >= 1 and stack.inspect(second)["State"]["Running"], 60)
        # ... but not the one `docker kill` stopped: the engine counts that as stopped by hand.
        state = stack.inspect(first)["State"]
        assert not state["Running"] and state["ExitCode"] == 137
        _wait_finished(stack, run_id, 600)
        stack.log.append(f"killed-worker run finished {time.monotonic() - killed_at:.1f} s after the kills")
        after = _finished(stack, run_id)
        assert_same_weights(after.weights, demo.weights)
        assert after.accuracy == demo.accuracy
        assert after.workers <= WORKERS
        subprocess.run(["docker", "start", first], check=True, capture_output=True)
    _both_workers_back(stack)


def _spanning(stack: Stack, run_id: str, worker: str, moment: float) -> list[Any]:
    """The tasks of `worker` that had started at `moment` and finished after it."""
    store = open_store(stack.database_url())
    try:
        rows = store.task_timings(run_id)
    finally:
        store.close()
    return [row for row in rows if row.worker == worker and row.started_at <= moment <= row.finished_at]


def test_compose_stop_lets_the_running_task_finish(stack: Stack, demo: Finished) -> None:
    with _slow_workers(stack, 0.2):
        run_id = _submit(stack, demo)
        drained: list[Any] = []
        # Stopped while a round trains: nearly always in the middle of one of its tasks; if it was
        # between two, the worker is started again and stopped in a later round.
        for round_index in (2, 4, 6):
            wait_until(functools.partial(_training, stack, run_id, round_index), 300)
            stopping_at = time.time()
            started = time.monotonic()
            stack.compose("stop", "worker-cpu", timeout=GRACE_S + 60)
            took = time.monotonic() - started
            stack.log.append(f"docker-compose stop worker-cpu in round {round_index}: {took:.1f} s")
            state = stack.inspect(stack.container("worker-cpu"))["State"]
            # SIGTERM: the worker finished what it ran and exited on its own, well before the grace period's SIGKILL.
            assert state["ExitCode"] == 0 and not state["OOMKilled"], state
            assert took < GRACE_S
            logs = stack.logs("worker-cpu")
            assert "running tasks finish first" in logs, logs
            drained = _spanning(stack, run_id, "cpu0@host1", stopping_at)
            stack.compose("start", "worker-cpu")
            if drained:
                break
        _wait_finished(stack, run_id, 600)
    # The task that was running when the stop came was finished by that worker, not lost and sent again.
    assert drained, "no stop came during a task"
    assert all(row.state == "done" and row.attempt == 1 for row in drained), drained
    assert_same_weights(_finished(stack, run_id).weights, demo.weights)
    _both_workers_back(stack)


def test_redis_recreated_on_its_aof_volume_keeps_the_queue(stack: Stack, demo: Finished) -> None:
    stack.compose("stop", "worker-cpu", "worker-cpu-2", timeout=GRACE_S + 60)
    run_id = _submit(stack, demo)
    client = stack.redis()

    def queued() -> dict[bytes, int]:
        # The task queues (Redis lists), not Celery's short-lived broadcast replies (pidbox).
        keys = [key for key in client.scan_iter(count=1000) if b"pidbox" not in key and client.type(key) == b"list"]
        return {key: int(client.llen(key)) for key in keys}

    before = queued()
    assert sum(before.values()) > 0, "the submitted round is not queued"
    old = stack.container("redis")
    stack.compose("up", "-d", "--no-deps", "--force-recreate", "redis")
    new = stack.container("redis")
    assert new != old  # another container; the same volume
    client = stack.redis()
    wait_until(lambda: redis_answers(client), 60)
    assert queued() == before
    stack.compose("start", "worker-cpu", "worker-cpu-2")
    _wait_finished(stack, run_id, 600)
    assert_same_weights(_finished(stack, run_id).weights, demo.weights)
