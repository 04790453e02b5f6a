"""docker-compose.yml as users meet it: validated by docker-compose, and each service's command run as a process.

No Docker engine runs here, so the smoke test reads the resolved compose file and starts
what each container would start (its entrypoint, command and environment), with hosts and
ports rewritten through the compose variables a second host would set: Redis from the
redis service's own command, Postgres the real server (a fresh database), CPU workers,
Flower, and the CLI running a short config. The run must finish with its results in Postgres.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
import redis
import yaml

from fedqueue.core.database import open_store
from fedqueue.fl.store.results import device_tasks, list_rounds
from tests.support.reliability_support import wait_until
from tests.support.service_support import free_port, http_get, redis_answers, required_tool

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILE = ROOT / "docker-compose.yml"
ENV_EXAMPLE = ROOT / ".env.example"
FEDQUEUE = str(Path(sys.executable).with_name("fedqueue"))


def _env_file(folder: Path, **values: str) -> Path:
    """.env.example with some variables set differently, as a user's .env."""
    lines = [line for line in ENV_EXAMPLE.read_text().splitlines() if line.split("=")[0] not in values]
    path = folder / ".env"
    path.write_text("\n".join(lines + [f"{name}={value}" for name, value in values.items()]) + "\n")
    return path


def _config(env_file: Path) -> subprocess.CompletedProcess[str]:
    command = [
        required_tool("docker-compose", "docker-compose", "docker-compose.yml"),
        "--project-directory",
        str(ROOT),
        "-f",
        str(COMPOSE_FILE),
        "--env-file",
        str(env_file),
    ]
    return subprocess.run([*command, "config"], capture_output=True, text=True, timeout=60, env=_bare_env())


def _bare_env() -> dict[str, str]:
    # Only what compose needs: variables of this shell must not leak into the resolved file.
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": os.environ.get("HOME", "/tmp")}


def _services(env_file: Path) -> dict[str, Any]:
    resolved = _config(env_file)
    assert resolved.returncode == 0, resolved.stderr
    return dict(yaml.safe_load(resolved.stdout)["services"])


def _in_profile(services: dict[str, Any], profile: str) -> set[str]:
    return {name for name, service in services.items() if profile in service.get("profiles", [])}


def test_compose_validates_and_each_profile_starts_what_the_readme_says(tmp_path: Path) -> None:
    services = _services(_env_file(tmp_path))
    assert _in_profile(services, "gpu") == {"redis", "postgres", "flower", "worker-gpu0", "worker-gpu1"}
    assert _in_profile(services, "cpu") == {"redis", "postgres", "flower", "worker-cpu"}
    assert _in_profile(services, "cli") == {"cli"} and _in_profile(services, "llm") == {"worker-llm"}
    # One worker per GPU, named after the GPU it reserves.
    for index in (0, 1):
        worker = services[f"worker-gpu{index}"]
        (devices,) = worker["deploy"]["resources"]["reservations"]["devices"]
        assert devices["device_ids"] == [str(index)] and devices["capabilities"] == ["gpu"]
        assert worker["command"] == ["worker", "--name", f"gpu{index}"]
        assert worker["stop_grace_period"] == "3600s" and worker["stop_signal"] == "SIGTERM"
        assert {"redis", "postgres"} == set(worker["depends_on"])
        assert all(dep["condition"] == "service_healthy" for dep in worker["depends_on"].values())
    # A container's /dev/shm is its own and 64 MB: blobs go through Redis unless the .env says otherwise.
    for name, service in services.items():
        if name not in ("redis", "postgres"):
            assert service["environment"]["FEDQUEUE_BLOB_SHM"] == "off", name
    assert all(services[f"worker-gpu{index}"]["shm_size"] in ("64m", 64 * 2**20) for index in (0, 1))
    llm = services["worker-llm"]
    assert (
        "--gpus-per-worker" in llm["command"]
        and len(llm["deploy"]["resources"]["reservations"]["devices"][0]["device_ids"]) == 2
    )
    redis_command = " ".join(services["redis"]["command"])
    for flag in ("--appendonly yes", "--appendfsync everysec", "--maxmemory-policy noeviction"):
        assert flag in redis_command
    for name in ("redis", "postgres"):
        assert services[name]["healthcheck"]["test"] and services[name]["volumes"]
    # Secrets reach containers through their environment, never their command lines.
    secrets = ("change-me-redis", "change-me-postgres", "change-me-flower")
    for name, service in services.items():
        words = json.dumps([service.get("command"), service.get("entrypoint"), service.get("healthcheck")])
        assert not any(secret in words for secret in secrets), name
    flower = services["flower"]
    assert flower["environment"]["FLOWER_BASIC_AUTH"] == "admin:change-me-flower"
    (published,) = flower["ports"]
    assert str(published).startswith("127.0.0.1:5555:") or published.get("host_ip") == "127.0.0.1"


def test_compose_names_a_missing_password(tmp_path: Path) -> None:
    env_file = _env_file(tmp_path)
    env_file.write_text("\n".join(line for line in env_file.read_text().splitlines() if "REDIS_PASSWORD" not in line))
    resolved = _config(env_file)
    assert resolved.returncode != 0
    assert "set REDIS_PASSWORD in .env" in resolved.stderr


def _entrypoint() -> list[str]:
    """The image's ENTRYPOINT (exec form), read from workers/Dockerfile."""
    (line,) = [
        line for line in (ROOT / "workers" / "Dockerfile").read_text().splitlines() if line.startswith("ENTRYPOINT")
    ]
    return list(json.loads(line.removeprefix("ENTRYPOINT")))


class Processes:
    """Each service's process in its own session, stopped (then killed) at the end."""

    def __init__(self, logs: Path) -> None:
        self.logs = logs
        self.started: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, name: str, command: list[str], environment: dict[str, str]) -> subprocess.Popen[bytes]:
        env = {**os.environ, **{key: str(value) for key, value in environment.items()}}
        log = (self.logs / f"{name}.log").open("wb")
        process = subprocess.Popen(
            command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        self.started[name] = process
        return process

    def log(self, name: str) -> str:
        return (self.logs / f"{name}.log").read_text(errors="replace")[-3000:]

    def stop(self) -> None:
        for process in self.started.values():
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
        deadline = time.monotonic() + 30
        for process in self.started.values():
            try:
                process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()


@pytest.fixture
def processes(tmp_path: Path) -> Iterator[Processes]:
    started = Processes(tmp_path)
    try:
        yield started
    finally:
        started.stop()


def _as_run(command: list[Any]) -> list[str]:
    """A command as the container gets it: `config` prints `$$` (a literal `$`) still escaped."""
    return [str(part).replace("$$", "$") for part in command]


def _redis_command(service: dict[str, Any], folder: Path, port: int) -> list[str]:
    """The redis service's command, with its container paths and port moved onto this machine."""
    command = _as_run(service["command"])
    script = (
        command[-1].replace("/tmp/redis.conf", str(folder / "redis.conf")).replace("--dir /data", f"--dir {folder}")
    )
    assert "--port 6379" in script
    return [*command[:-1], script.replace("--port 6379", f"--port {port}")]


def test_each_service_runs_as_a_process_and_a_run_lands_in_postgres(
    tmp_path: Path, processes: Processes, postgres_url: str
) -> None:
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed: the redis service's command cannot run here")
    from sqlalchemy.engine import make_url

    database = make_url(postgres_url)
    redis_port, flower_port = free_port(), free_port()
    prefix = f"fqcompose-{uuid.uuid4().hex[:8]}"
    services = _services(
        _env_file(
            tmp_path,
            COMPOSE_PROFILES="cpu",
            FEDQUEUE_REDIS_HOST="127.0.0.1",
            FEDQUEUE_REDIS_PORT=str(redis_port),
            FEDQUEUE_POSTGRES_HOST=str(database.host),
            FEDQUEUE_POSTGRES_PORT=str(database.port or 5432),
            FEDQUEUE_POSTGRES_USER=str(database.username),
            FEDQUEUE_POSTGRES_DB=str(database.database),
            FEDQUEUE_KEY_PREFIX=prefix,
            FEDQUEUE_TASK_TIME_LIMIT_S="120",
            FEDQUEUE_CPU_PROCS="2",
        )
    )
    redis_folder = tmp_path / "redis"
    redis_folder.mkdir()
    redis_service = services["redis"]
    processes.start("redis", _redis_command(redis_service, redis_folder, redis_port), redis_service["environment"])
    password = redis_service["environment"]["REDIS_PASSWORD"]
    client = redis.Redis(port=redis_port, password=password)
    wait_until(lambda: redis_answers(client), 60)
    assert client.config_get("maxmemory-policy")["maxmemory-policy"] == "noeviction"
    assert client.config_get("appendfsync")["appendfsync"] == "everysec"
    with pytest.raises(redis.AuthenticationError):
        redis.Redis(port=redis_port).ping()

    entrypoint = [FEDQUEUE if part == "fedqueue" else part for part in _entrypoint()]
    worker = services["worker-cpu"]
    processes.start("worker", [*entrypoint, *_as_run(worker["command"])], worker["environment"])
    flower = services["flower"]
    flower_command = _as_run(flower["command"])
    flower_command[flower_command.index("--port") + 1] = str(flower_port)
    flower_command[flower_command.index("--address") + 1] = "127.0.0.1"
    processes.start("flower", [FEDQUEUE, *flower_command], flower["environment"])

    # `docker compose run --rm cli fedqueue run ...`: the cli service's entrypoint is empty.
    cli = services["cli"]
    assert cli["entrypoint"] == [] and cli["command"][0] == "fedqueue"
    env = {**os.environ, **{key: str(value) for key, value in cli["environment"].items()}}
    finished = subprocess.run(
        [FEDQUEUE, "run", "examples/digits_fedavg.toml", "--rounds", "2"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert finished.returncode == 0, finished.stdout[-2000:] + finished.stderr[-2000:] + processes.log("worker")
    run_id = re.search(r"run ([0-9a-f]{12})", finished.stdout + finished.stderr)
    assert run_id is not None, finished.stdout

    # The run's results are in the Postgres database the compose variables pointed at.
    store = open_store(postgres_url)
    try:
        run = store.get_run(run_id.group(1))
        assert run.state == "finished"
        rounds = list_rounds(store, run.id)
        assert [row.state for row in rounds] == ["done", "done"]
        workers = {row.worker for row in device_tasks(store, run.id)}
    finally:
        store.close()
    assert {worker.split("@")[0] for worker in workers} == {"cpu0", "cpu1"}

    # Flower, as the flower service starts it: behind basic auth, watching the same broker.
    user, _, flower_password = str(flower["environment"]["FLOWER_BASIC_AUTH"]).partition(":")
    base = f"http://127.0.0.1:{flower_port}"
    auth = (user, flower_password)
    wait_until(lambda: http_get(f"{base}/healthcheck")[0] == 200, 60)
    assert http_get(f"{base}/workers")[0] == 401 and http_get(f"{base}/api/workers")[0] == 401
    assert http_get(f"{base}/workers", auth)[0] == 200

    def listed() -> set[str]:
        status, names = http_get(f"{base}/api/workers?refresh=1", auth)
        return set(names) if status == 200 else set()

    wait_until(lambda: listed() == workers, 60)
    # No password on any process's command line; Flower runs read-only.
    command_lines = []
    for process in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            command_lines.append(" ".join(process.cmdline()))
    assert not [line for line in command_lines if flower_password in line or password in line]
    assert [line for line in command_lines if f"--port={flower_port}" in line and "--read_only=True" in line]
    assert client.dbsize() > 0  # the run used this Redis, not another
