"""`fedqueue cancel`, and Ctrl-C on a command that follows a run: real Redis, real workers, real processes."""

from __future__ import annotations

import json
import os
import pty
import signal
import subprocess
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from fedqueue.config import Settings
from fedqueue.core.runs.cancel import CANCELLED
from fedqueue.core.runs.supervisor import repair
from fedqueue.core.services import Services
from fedqueue.fl.scheduler import submit_run
from fedqueue.llm.job import JobRequest, submit_job
from fedqueue.llm.results import prompt_rows
from fedqueue.llm.settings import GenerationSettings
from fedqueue.llm.tiny import build_tiny_llama
from fedqueue.queue.app import make_app
from fedqueue.queue.client import open_client_services
from fedqueue.queue.purge import message_run, queue_lists
from tests.conftest import running_workers
from tests.support.cli_inputs import cli_env
from tests.support.cli_runner import FEDQUEUE_CLI, fedqueue_cli, interruptible
from tests.support.helpers import small_config
from tests.support.reliability_support import wait_until

pytestmark = pytest.mark.sessions  # `make test-sessions`

SYNC: dict[str, Any] = {"rounds": 40, "num_devices": 30, "devices_per_round": 6}
BUFFERED: dict[str, Any] = {
    "mode": "fedbuff",
    "num_devices": 30,
    "concurrency": 4,
    "buffer_size": 2,
    "max_model_version": 500,
    "device_speed": {"mean": [0.01], "std": [0.001], "share": [1.0]},
}


@pytest.fixture(scope="module")
def cluster(redis_url: str, key_prefix: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Settings]:
    """Two ready workers shared by the module's tests (each test's runs have their own ids)."""
    folder = tmp_path_factory.mktemp("cancel")
    settings = Settings(
        broker_url=redis_url,
        database_url=f"sqlite:///{folder / 'fedqueue.db'}",
        key_prefix=f"{key_prefix}-{uuid.uuid4().hex[:6]}",
        task_time_limit_s=120,
    )
    with running_workers(settings, procs=2, log_dir=folder / "logs"):
        yield settings


@pytest.fixture(scope="module")
def tiny_model_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_llama(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture
def services(cluster: Settings) -> Iterator[Services]:
    opened = open_client_services(cluster, worker_slots=lambda: {})
    yield opened
    opened.close()


def active_tasks(settings: Settings, run_id: str) -> int:
    """Tasks of the run that the workers are running now (Celery's own answer)."""
    app = make_app(settings)
    try:
        answers = app.control.inspect(timeout=1.0).active() or {}
    finally:
        app.close()
    return sum(1 for tasks in answers.values() for task in tasks if run_id in json.dumps(task, default=str))


def queued_tasks(settings: Settings, run_id: str) -> int:
    client = redis.Redis.from_url(settings.broker_url or "")
    try:
        return sum(
            1 for name in queue_lists(settings) for raw in client.lrange(name, 0, -1) if message_run(raw) == run_id
        )
    finally:
        client.close()


def assert_cancelled_and_still(settings: Settings, services: Services, run_id: str) -> None:
    """Cancelled in the store, and within 10 s nothing of it runs or waits on the queues."""
    assert services.store.get_run(run_id).state == CANCELLED
    wait_until(lambda: active_tasks(settings, run_id) == 0 and queued_tasks(settings, run_id) == 0, 10)
    assert services.store.get_run(run_id).state == CANCELLED
    assert repair(services, run_id) == []  # a repair pass (a follower's, a launcher's) leaves it alone
    assert run_id not in services.store.unleased_runs(created_before=float("inf"))  # no launcher adopts it


@pytest.mark.parametrize("mode", ["sync", "buffered"])
def test_cancel_of_a_running_fl_run(cluster: Settings, services: Services, tmp_path: Path, mode: str) -> None:
    config = small_config(**(SYNC if mode == "sync" else BUFFERED))
    run_id = submit_run(services, config)
    wait_until(lambda: len(services.store.task_timings(run_id)) >= 4, 60)  # under way
    env = cli_env(cluster)
    cancelled = fedqueue_cli("cancel", run_id, cwd=tmp_path, env=env)
    assert cancelled.returncode == 0, cancelled.stdout + cancelled.stderr
    assert cancelled.stdout.startswith(f"run {run_id} cancelled"), cancelled.stdout
    assert_cancelled_and_still(cluster, services, run_id)
    stored = len(services.store.task_timings(run_id))
    assert stored < (config.rounds * config.devices_per_round if mode == "sync" else 500 * 2)

    status = json.loads(fedqueue_cli("status", run_id, "--json", cwd=tmp_path, env=env).stdout)
    assert status["state"] == CANCELLED and status["tasks_done"] + status["tasks_failed"] <= stored
    listed = fedqueue_cli("runs", cwd=tmp_path, env=env)
    assert any(line.startswith(run_id) and f" {CANCELLED} " in line for line in listed.stdout.splitlines())
    again = fedqueue_cli("cancel", run_id, cwd=tmp_path, env=env)
    assert again.returncode == 0 and f"run {run_id} was already cancelled" in again.stdout
    resumed = fedqueue_cli("resume", run_id, cwd=tmp_path, env=env)
    assert resumed.returncode == 2 and resumed.stderr.splitlines() == [
        f"error: run {run_id} was cancelled: a cancelled run is not resumed (submit it again for a new run)"
    ]
    assert "Traceback" not in resumed.stdout + resumed.stderr


def test_cancel_of_a_running_llm_job(
    cluster: Settings, services: Services, tmp_path: Path, tiny_model_path: Path
) -> None:
    lines = [json.dumps({"id": f"p{i}", "prompt": f"Count to {i}: " + "one " * (i % 7)}) for i in range(600)]
    (tmp_path / "in.jsonl").write_text("\n".join(lines) + "\n")
    request = JobRequest(
        input_path=tmp_path / "in.jsonl",
        model=str(tiny_model_path),
        generation=GenerationSettings(max_new_tokens=32),
        batch_size=2,
    )
    job = submit_job(services, request).job_id
    wait_until(lambda: len(services.store.task_timings(job)) >= 2, 60)
    env = cli_env(cluster)
    cancelled = fedqueue_cli("cancel", job, cwd=tmp_path, env=env)
    assert cancelled.returncode == 0, cancelled.stdout + cancelled.stderr
    assert f"run {job} cancelled" in cancelled.stdout
    assert_cancelled_and_still(cluster, services, job)
    # Each batch was stored whole or not at all, and what was not generated stays pending.
    by_batch: dict[int, set[str]] = {}
    for row in prompt_rows(services.store, job):
        by_batch.setdefault(row.batch or 0, set()).add(row.state)
    assert all(len(states) == 1 for states in by_batch.values()), by_batch
    assert {"done"} in by_batch.values() and {"pending"} in by_batch.values()
    # The same input again would reopen the job: refused, in one line.
    again = fedqueue_cli(
        "llm", "submit", str(tmp_path / "in.jsonl"), "--model", str(tiny_model_path), "--max-new-tokens", "32",
        "--batch-size", "2", "--detach", cwd=tmp_path, env=env,
    )  # fmt: skip
    assert again.returncode == 2 and "Traceback" not in again.stderr
    assert again.stderr.strip().splitlines()[-1] == f"error: job {job} was cancelled; use another --job to run it again"


def test_cancel_of_what_is_not_running_is_one_line(cluster: Settings, services: Services, tmp_path: Path) -> None:
    env = cli_env(cluster)
    services.store.create_run("done-run", "x", {}, 1, kind="fl")
    services.store.finish_run("done-run", "finished")
    finished = fedqueue_cli("cancel", "done-run", cwd=tmp_path, env=env)
    assert finished.returncode == 2 and finished.stderr == "error: run done-run already finished: nothing to cancel\n"
    unknown = fedqueue_cli("cancel", "nope", cwd=tmp_path, env=env)
    assert unknown.returncode == 2 and unknown.stderr == "error: run 'nope' does not exist\n"


# --- Ctrl-C on `fedqueue run`


class Terminal:
    """A command on a pseudo-terminal of its own, as a user's shell runs it: what it prints, read as it comes."""

    def __init__(self, args: list[str], env: dict[str, str], cwd: Path) -> None:
        master, slave = pty.openpty()
        self.process = subprocess.Popen(
            args, stdin=slave, stdout=slave, stderr=slave, env=env, cwd=cwd, start_new_session=True,
            preexec_fn=_take_terminal,
        )  # fmt: skip
        os.close(slave)
        self.master = master
        self._text = ""
        self._lock = threading.Lock()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        while True:
            try:
                data = os.read(self.master, 4096)
            except OSError:
                return
            if not data:
                return
            with self._lock:
                self._text += data.decode(errors="replace")

    @property
    def text(self) -> str:
        with self._lock:
            return self._text

    def wait_for(self, words: str, timeout_s: float = 120) -> None:
        wait_until(lambda: words in self.text or self.process.poll() is not None, timeout_s)
        assert words in self.text, self.text

    def type(self, keys: str) -> None:
        os.write(self.master, keys.encode())

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        os.close(self.master)


def _take_terminal() -> None:
    """In the child: make the pty (its stdin) its controlling terminal, so ^C typed there is a SIGINT to it."""
    import fcntl
    import termios

    fcntl.ioctl(0, termios.TIOCSCTTY, 0)
    interruptible()


@pytest.fixture
def run_config(tmp_path: Path) -> Path:
    path = tmp_path / "run.toml"
    path.write_text("num_devices = 30\ndevices_per_round = 6\nrounds = 200\nlocal_iters = 5\nseed = 3\n")
    return path


def _run_id(services: Services, before: set[str]) -> str:
    wait_until(lambda: len({run.id for run in services.store.list_runs()} - before) == 1, 120)
    (run_id,) = {run.id for run in services.store.list_runs()} - before
    wait_until(lambda: len(services.store.task_timings(run_id)) >= 2, 60)  # under way
    wait_until(lambda: services.store.get_run(run_id).lease_owner is not None, 60)  # and followed
    return run_id


def test_ctrl_c_on_run_asks_and_cancels(cluster: Settings, services: Services, run_config: Path) -> None:
    before = {run.id for run in services.store.list_runs()}
    terminal = Terminal([*FEDQUEUE_CLI, "run", str(run_config)], cli_env(cluster), run_config.parent)
    try:
        run_id = _run_id(services, before)
        terminal.type("\x03")  # Ctrl-C, as the terminal sends it: to the command's whole process group
        terminal.wait_for(f"cancel run {run_id}? [y/N] (N: leave it running)")
        terminal.type("y\n")
        assert terminal.process.wait(timeout=30) == 130, terminal.text
    finally:
        terminal.close()
    assert f"run {run_id} cancelled" in terminal.text and "Traceback" not in terminal.text
    assert_cancelled_and_still(cluster, services, run_id)


def test_a_second_ctrl_c_leaves_the_run_going(cluster: Settings, services: Services, run_config: Path) -> None:
    before = {run.id for run in services.store.list_runs()}
    terminal = Terminal([*FEDQUEUE_CLI, "run", str(run_config)], cli_env(cluster), run_config.parent)
    try:
        run_id = _run_id(services, before)
        terminal.type("\x03")
        terminal.wait_for("[y/N]")
        terminal.type("\x03")
        assert terminal.process.wait(timeout=30) == 130, terminal.text
    finally:
        terminal.close()
    assert "no answer: run" in terminal.text and f"fedqueue cancel {run_id} cancels it" in terminal.text
    _goes_on_then_cancel(cluster, services, run_id, run_config.parent)


def test_ctrl_c_without_a_terminal_leaves_the_run_going(
    cluster: Settings, services: Services, run_config: Path
) -> None:
    before = {run.id for run in services.store.list_runs()}
    process = subprocess.Popen(
        [*FEDQUEUE_CLI, "run", str(run_config)],
        stdin=subprocess.PIPE,  # never written to: the command must not wait for it
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=cli_env(cluster),
        cwd=run_config.parent,
        text=True,
        preexec_fn=interruptible,
    )
    try:
        run_id = _run_id(services, before)
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 130, out + err
    assert "stdin is no terminal to ask on: run" in err and f"run {run_id} goes on: fedqueue status {run_id}" in err, (
        out + err
    )
    assert "Traceback" not in err
    _goes_on_then_cancel(cluster, services, run_id, run_config.parent)


def _goes_on_then_cancel(cluster: Settings, services: Services, run_id: str, cwd: Path) -> None:
    """The run left going: the workers carry on with it; then cancelled, so the module's workers go quiet."""
    assert services.store.get_run(run_id).state == "running"
    done = len(services.store.task_timings(run_id))
    wait_until(lambda: len(services.store.task_timings(run_id)) > done, 30)
    assert fedqueue_cli("cancel", run_id, cwd=cwd, env=cli_env(cluster)).returncode == 0
    assert_cancelled_and_still(cluster, services, run_id)


def test_ctrl_c_on_run_with_its_own_workers_offers_to_keep_it_for_resume(
    redis_url: str, tmp_path: Path, run_config: Path
) -> None:
    env = cli_env(FEDQUEUE_DATABASE_URL=f"sqlite:///{tmp_path / 'own.db'}")  # blob files in the test's folder
    from fedqueue.core.database import open_store

    terminal = Terminal([*FEDQUEUE_CLI, "run", str(run_config), "--procs", "1"], env, tmp_path)
    try:
        terminal.wait_for("submitted")
        store = open_store(env["FEDQUEUE_DATABASE_URL"], migrate=False)
        try:
            wait_until(lambda: len(store.task_timings(store.list_runs()[0].id)) >= 1, 120)
            run_id = store.list_runs()[0].id
        finally:
            store.close()
        terminal.type("\x03")  # reaches the embedded Redis's and the workers' terminal too, were they on it
        terminal.wait_for("(N: keep it for `fedqueue resume`)")
        assert "its workers were started by this command and stop with it" in terminal.text
        terminal.type("n\n")
        assert terminal.process.wait(timeout=90) == 130, terminal.text
    finally:
        terminal.close()
    assert f"run {run_id} kept: fedqueue resume {run_id} goes on with it" in terminal.text, terminal.text
    assert "Traceback" not in terminal.text
    status = json.loads(fedqueue_cli("status", run_id, "--json", cwd=tmp_path, env=env).stdout)
    assert status["state"] == "running"
    cancelled = fedqueue_cli("cancel", run_id, cwd=tmp_path, env=env)  # no broker left: the store alone
    assert cancelled.returncode == 0 and f"run {run_id} cancelled" in cancelled.stdout, cancelled.stderr


def test_queued_tasks_of_a_cancelled_run_are_dropped_and_never_sent_again(settings: Settings) -> None:
    """On a queue no worker reads: the cancelled run's messages leave it, another run's stay, and the
    enqueuer of any process sends none of the cancelled run's again."""
    from fedqueue.api import cancel
    from fedqueue.llm.messages import GenerateBatch

    services = open_client_services(settings, worker_slots=lambda: {})
    try:
        for run_id in ("job-a", "job-b"):
            services.store.create_run(run_id, run_id, {}, 0, kind="llm")
            services.enqueue([GenerateBatch(run_id, batch, (f"k{batch}",), 0.0) for batch in range(3)])
        assert (queued_tasks(settings, "job-a"), queued_tasks(settings, "job-b")) == (3, 3)
        done = cancel("job-a", settings)
        assert (done.was, done.dropped, done.cancelled_now) == ("running", 3, True)
        assert (queued_tasks(settings, "job-a"), queued_tasks(settings, "job-b")) == (0, 3)
        services.enqueue([GenerateBatch("job-a", 9, ("k9",), 0.0), GenerateBatch("job-b", 9, ("k9",), 0.0)])
        assert (queued_tasks(settings, "job-a"), queued_tasks(settings, "job-b")) == (0, 4)
        assert cancel("job-a", settings).was == CANCELLED and services.store.get_run("job-b").state == "running"
    finally:
        services.close()
