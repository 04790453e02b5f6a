"""The `fedqueue` command as a user meets it: real processes, real exit codes, one-line errors."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import re
import signal
import socket
import struct
import subprocess
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from importlib import metadata
from pathlib import Path

import psutil
import pytest
from sqlalchemy import create_engine, inspect

from fedqueue.config import Settings
from fedqueue.core.database import open_store
from fedqueue.store.db import CONNECT_TIMEOUT_S
from tests.support.cli_inputs import SMALL, cli_env, write_config
from tests.support.cli_runner import fedqueue_cli, start_fedqueue_cli
from tests.support.own_processes import ProcessMark
from tests.support.reliability_support import ping_count, wait_until


@pytest.mark.sessions
def test_run_with_nothing_configured_uses_embedded_redis_and_leaves_nothing(tmp_path: Path) -> None:
    """`fedqueue run` with no broker: embedded Redis + local workers, default SQLite store, clean exit."""
    mark = ProcessMark(tmp_path)
    config = write_config(tmp_path, SMALL)
    result = fedqueue_cli("run", str(config), "--procs", "2", cwd=tmp_path, env=mark.env(cli_env()), timeout=240)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "embedded Redis at redis://127.0.0.1:" in result.stdout
    assert ":6379/" not in result.stdout  # never the Redis it did not start
    assert "max_concurrency" in result.stdout
    assert (tmp_path / "fedqueue.db").exists()
    assert mark.alive() == set()  # its embedded Redis and workers stopped with it

    runs = json.loads(fedqueue_cli("runs", "--json", cwd=tmp_path, env=cli_env()).stdout)
    assert len(runs) == 1 and runs[0]["state"] == "finished" and runs[0]["rounds"] == "2/2"
    status = json.loads(fedqueue_cli("status", runs[0]["id"], "--json", cwd=tmp_path, env=cli_env()).stdout)
    assert status["rounds_done"] == 2 and status["tasks_done"] == 16
    assert set(status["accuracy"]) == {"1", "2"}
    assert len(status["workers"]) == 2 and status["max_concurrency"] >= 2
    assert status["wall_s"] > 0


@pytest.mark.sessions
def test_up_then_submit_from_another_shell(tmp_path: Path) -> None:
    """`fedqueue up` serves a broker; `submit` from elsewhere returns an id; the run finishes."""
    env = cli_env(FEDQUEUE_DATABASE_URL=f"sqlite:///{tmp_path / 'shared.db'}")
    mark = ProcessMark(tmp_path)
    up = start_fedqueue_cli(
        "up", "--procs", "1", cwd=tmp_path, env=mark.env(env), stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    try:
        broker = None
        assert up.stdout is not None
        for line in up.stdout:
            if "FEDQUEUE_BROKER_URL=" in line:
                broker = line.strip().split("FEDQUEUE_BROKER_URL=")[1]
                break
        assert broker and broker.startswith("redis://127.0.0.1:")
        submitted = fedqueue_cli(
            "submit", str(write_config(tmp_path, SMALL)), cwd=tmp_path, env={**env, "FEDQUEUE_BROKER_URL": broker}
        )
        assert submitted.returncode == 0, submitted.stderr
        run_id = submitted.stdout.strip()
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            status = json.loads(fedqueue_cli("status", run_id, "--json", cwd=tmp_path, env=env).stdout)
            if status["state"] != "running":
                break
            time.sleep(0.5)
        assert status["state"] == "finished" and status["tasks_done"] == 16
    finally:
        up.send_signal(signal.SIGINT)
        assert up.wait(timeout=60) == 0
    assert mark.alive() == set()


def test_worker_stops_on_sigterm_and_leaves_no_children(settings: Settings, tmp_path: Path) -> None:
    env = cli_env(**settings.to_env())
    worker = start_fedqueue_cli(
        "worker", "--procs", "1", cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    children: list[psutil.Process] = []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not children:
        children = psutil.Process(worker.pid).children()
        time.sleep(0.2)
    assert len(children) == 1
    wait_until(lambda: ping_count(settings) == 1, 60)  # a worker that answers has set up its signal handlers
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(timeout=60) == 0
    assert not any(child.is_running() and child.status() != psutil.STATUS_ZOMBIE for child in children)


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("colour = 'red'\n", "colour"),
        ("rounds = 'ten'\n", "rounds"),
        ("rounds = true\n", "rounds"),
        ("rounds = 0\n", "rounds"),
        ("num_devices = -5\n", "num_devices"),
        ("local_batch_size = 0\n", "local_batch_size"),
        ("local_iters = 0\n", "local_iters"),
        ("eval_every = 0\n", "eval_every"),
        ("samples_per_device = 0\n", "samples_per_device"),
        ("num_devices = 10\ndevices_per_round = 11\n", "devices_per_round"),
        ("dataset = 'mnist'\n", "dataset"),
        ("model = 'vgg'\n", "model"),
        ("partition = 'by-writer'\n", "partition"),
        ("local_optimizer = 'lion'\n", "local_optimizer"),
        ("local_iters = 3\nlocal_epochs = 1\n", "local_iters"),
        ("local_lr = 0\n", "local_lr"),
        ("global_lr = -1.0\n", "global_lr"),
        ("alpha = 0\n", "alpha"),
        ("local_momentum = 1.0\n", "local_momentum"),
        ("local_lr = nan\n", "local_lr"),
        ("seed = -1\n", "seed"),
        ("dataset = 'cifar10'\n", "data_root"),
        ("dataset = 'cifar10'\ndata_root = '/no/such/folder'\n", "/no/such/folder"),
        ("rounds = = 3\n", "invalid TOML"),
        (f"name = '{'n' * 201}'\n", "name"),
        ("pack_size = 0\n", "pack_size"),
        ("pack_size = 'big'\n", "pack_size"),
        ("pack_size = 10001\n", "pack_size"),
        ("pack_size = 2.5\n", "pack_size"),
        ("pack_mode = 'parallel'\n", "pack_mode"),
    ],
)
def test_bad_config_is_one_line_exit_2_and_writes_nothing(tmp_path: Path, text: str, field: str) -> None:
    config = write_config(tmp_path, text)
    database = tmp_path / "store.db"
    env = cli_env(FEDQUEUE_DATABASE_URL=f"sqlite:///{database}", FEDQUEUE_BROKER_URL="redis://127.0.0.1:1/0")
    result = fedqueue_cli("submit", str(config), cwd=tmp_path, env=env)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and field in lines[0], result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    assert not database.exists()


def test_bad_override_names_the_field(tmp_path: Path) -> None:
    config = write_config(tmp_path, SMALL)
    env = cli_env(FEDQUEUE_BROKER_URL="redis://127.0.0.1:1/0")
    result = fedqueue_cli("submit", str(config), "--set", "devices_per_round=50", cwd=tmp_path, env=env)
    assert result.returncode == 2 and "devices_per_round" in result.stderr


class ResettingListener:
    """A port that accepts each connection, notes when, and resets it at once: a service that cannot be
    talked to, whose connection attempts the test can count (a closed port refuses them unseen)."""

    def __init__(self) -> None:
        self._socket = socket.create_server(("127.0.0.1", 0))
        self.port = self._socket.getsockname()[1]
        self.attempts: list[float] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        with contextlib.suppress(OSError):  # closed by close()
            while True:
                connection, _ = self._socket.accept()
                self.attempts.append(time.monotonic())
                connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                connection.close()  # linger 0: a reset, not an orderly close

    def close(self) -> None:
        self._socket.close()


@pytest.mark.parametrize(
    ("variable", "url", "what"),
    [
        ("FEDQUEUE_BROKER_URL", "redis://:hunter2@127.0.0.1:{port}/0", "broker"),
        ("FEDQUEUE_DATABASE_URL", "postgresql://fq:hunter2@127.0.0.1:{port}/fq", "database"),
    ],
)
def test_unreachable_service_is_one_line_within_10s(tmp_path: Path, variable: str, url: str, what: str) -> None:
    """One attempt, then one line: no retries that keep the user waiting.

    Timed from the command's first connection, not from its start: starting Python and importing the run's
    modules takes seconds, ten and more on a loaded machine, and says nothing about how the command handles a
    service it cannot reach. From that attempt to the exit, a retry loop with backoff takes many seconds; one
    attempt takes well under one; 10 s (two of the store's connect timeouts) leaves room for a slow machine.
    """
    listener = ResettingListener()
    try:
        env = cli_env(**{"FEDQUEUE_BROKER_URL": "redis://127.0.0.1:1/0", variable: url.format(port=listener.port)})
        result = fedqueue_cli("run", str(write_config(tmp_path, SMALL)), cwd=tmp_path, env=env, timeout=180)
        ended = time.monotonic()
    finally:
        listener.close()
    assert result.returncode == 2, result.stdout + result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert result.stderr.startswith(f"error: {what}") and "unreachable" in result.stderr
    assert "hunter2" not in result.stderr and "Traceback" not in result.stderr
    assert len(listener.attempts) == 1
    assert ended - listener.attempts[0] < 2 * CONNECT_TIMEOUT_S


def test_unknown_run_id(tmp_path: Path) -> None:
    """A store with no runs yet: read-only commands say so in one line and create nothing."""
    result = fedqueue_cli("status", "nope", cwd=tmp_path, env=cli_env())
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1
    assert "has no fedqueue tables" in result.stderr
    database = tmp_path / "fedqueue.db"
    assert not database.exists() or not inspect(create_engine(f"sqlite:///{database}")).get_table_names()
    open_store(f"sqlite:///{tmp_path / 'fedqueue.db'}", migrate=True).close()
    result = fedqueue_cli("status", "nope", cwd=tmp_path, env=cli_env())
    assert result.returncode == 2 and result.stderr.strip() == "error: run 'nope' does not exist"


@pytest.mark.parametrize("command", ["monitor", "flower"])
def test_monitor_without_a_broker_or_basic_auth_is_one_line_and_starts_nothing(tmp_path: Path, command: str) -> None:
    """`monitor` starts Celery's Flower UI; `flower`, its first name, still does."""
    result = fedqueue_cli(command, cwd=tmp_path, env=cli_env(FLOWER_BASIC_AUTH="admin:pw"))
    assert result.returncode == 2 and "FEDQUEUE_BROKER_URL: not set" in result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    result = fedqueue_cli(command, cwd=tmp_path, env=cli_env(FEDQUEUE_BROKER_URL="redis://127.0.0.1:6379/0"))
    assert result.returncode == 2 and "FLOWER_BASIC_AUTH: not set" in result.stderr
    assert "Traceback" not in result.stderr + result.stdout


def test_help_names_monitor_as_celerys(tmp_path: Path) -> None:
    listed = fedqueue_cli("--help", cwd=tmp_path, env=cli_env(COLUMNS="200"))
    assert listed.returncode == 0
    (line,) = [line for line in listed.stdout.splitlines() if re.search(r"\bmonitor\b", line)]
    assert "Celery's monitor" in line and "not the Flower FL framework" in line


def test_version_is_the_installed_packages(tmp_path: Path) -> None:
    version = fedqueue_cli("--version", cwd=tmp_path, env=cli_env())
    assert version.returncode == 0 and version.stdout == f"fedqueue {metadata.version('fedqueue')}\n"


def test_a_url_whose_port_is_no_number_is_one_line_exit_2_for_every_command(tmp_path: Path) -> None:
    config = str(write_config(tmp_path, SMALL))
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "a"}\n')
    commands = [
        ("run", config),
        ("submit", config),
        ("status", "x"),
        ("worker", "--procs", "1"),
        ("up", "--detach", "--procs", "1"),
        ("monitor",),
        ("llm", "submit", str(prompts), "--model", str(tmp_path)),
    ]
    cases = [("FEDQUEUE_BROKER_URL", "redis://127.0.0.1:abc/0", args) for args in commands]
    cases += [("FEDQUEUE_DATABASE_URL", "postgresql+psycopg://u@h:abc/db", args) for args in commands[:4]]

    def attempt(case: tuple[str, str, tuple[str, ...]]) -> subprocess.CompletedProcess[str]:
        variable, url, args = case
        return fedqueue_cli(*args, cwd=tmp_path, env=cli_env(**{variable: url, "FLOWER_BASIC_AUTH": "admin:pw"}))

    with ThreadPoolExecutor(3) as pool:
        results = list(pool.map(attempt, cases))
    for (variable, _, args), result in zip(cases, results, strict=True):
        assert result.returncode == 2, (args, result.stdout + result.stderr)
        assert (
            result.stderr == f"error: {variable}: not a valid URL (port could not be cast to integer value as 'abc')\n"
        )


def test_brackets_in_what_is_echoed_are_printed_as_written(tmp_path: Path) -> None:
    """Rich markup takes `[...]` for a style: a path, a name or a hint with brackets must reach the terminal whole."""
    missing = fedqueue_cli("run", "missing[v2].toml", cwd=tmp_path, env=cli_env())
    assert missing.returncode == 2 and missing.stderr == "error: config: file 'missing[v2].toml' does not exist\n"
    open_store(f"sqlite:///{tmp_path / 'fedqueue.db'}", migrate=True).close()
    unknown = fedqueue_cli("status", "[bold]x[/bold]", cwd=tmp_path, env=cli_env())
    assert unknown.returncode == 2 and unknown.stderr == "error: run '[bold]x[/bold]' does not exist\n"
    if importlib.util.find_spec("vllm") is not None:
        return  # the hint below is for a machine without vLLM
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "a"}\n')
    model = tmp_path / "model"
    model.mkdir()
    vllm = fedqueue_cli(
        "llm", "submit", str(prompts), "--model", str(model), "--backend", "vllm", cwd=tmp_path, env=cli_env()
    )
    assert vllm.returncode == 2 and "(pip install 'fedqueue[vllm]', or make vllm)" in vllm.stderr, vllm.stderr


def test_runs_at_80_columns_shows_whole_ids_states_and_dates_of_fl_runs_and_llm_jobs(tmp_path: Path) -> None:
    database = tmp_path / "store.db"
    store = open_store(f"sqlite:///{database}", migrate=True)
    fl_run = uuid.uuid4().hex[:12]  # the ids as fedqueue makes them, and the longest `--job` id
    llm_job = f"llm-{uuid.uuid4().hex[:12]}"
    named_job = "j" * 32
    try:
        store.create_run(
            fl_run, "digits fedavg, 100 devices, 20 a round", {"dataset": "digits", "model": "mlp"}, 10, kind="fl"
        )
        store.finish_run(fl_run, "finished")
        for job in (llm_job, named_job):
            config = {"input": "prompts-of-the-evaluation-set.jsonl", "model": "HuggingFaceTB/SmolLM2-135M-Instruct"}
            store.create_run(job, config["input"], config, 0, kind="llm")
        store.finish_run(llm_job, "failed")
    finally:
        store.close()
    expected = {fl_run: "finished", llm_job: "failed", named_job: "running"}
    # A lease long past the test's length: the unfollowed "running" job must not turn stalled on a slow machine.
    env = cli_env(FEDQUEUE_DATABASE_URL=f"sqlite:///{database}", FEDQUEUE_LEASE_TTL_S="3600")
    for columns in ("80", "100", "120", None):  # None: piped with no COLUMNS
        result = fedqueue_cli("runs", cwd=tmp_path, env=env if columns is None else {**env, "COLUMNS": columns})
        assert result.returncode == 0, result.stderr
        lines = result.stdout.splitlines()
        assert all(len(line) <= int(columns or 160) for line in lines), result.stdout
        assert lines[0].split()[:2] == ["id", "kind"] and lines[0].split()[-2:] == ["state", "age"], result.stdout
        for run_id, state in expected.items():
            (row,) = [line for line in lines if line.startswith(f"{run_id} ")]
            assert re.search(rf" {state} +\d+s$", row), result.stdout
