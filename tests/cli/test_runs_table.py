"""`fedqueue runs` at 80 columns: each run recognisable by its kind, name, progress, accuracy, state and age; a
run that nothing schedules shows `stalled`. Real rows in a real store, read by the command."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import update

from fedqueue.cli.runs_table import _shorten, age, runs_table
from fedqueue.core.database import open_store
from fedqueue.fl.store.results import add_round, claim_round, complete_round
from fedqueue.llm.results import insert_prompts
from fedqueue.llm.schema import LlmPromptRow
from fedqueue.report.summary import run_lines
from fedqueue.store import Store
from fedqueue.store.schema import RunRow
from tests.store.test_store import round_row
from tests.support.cli_inputs import cli_env
from tests.support.cli_runner import FEDQUEUE_CLI, fedqueue_cli, interruptible
from tests.support.reliability_support import wait_until

GGUF = "/home/someone/models/smollm2-135m-instruct/HuggingFaceTB-SmolLM2-135M-Instruct-Q8_0.gguf"


def fl_run(store: Store, run_id: str, name: str, config: dict[str, Any], total: int | None, made: int) -> None:
    """An FL run with `made` rounds (versions) aggregated, accuracy rising to 0.5 + made / 100."""
    store.create_run(run_id, name, {"dataset": "digits", "model": "mlp", **config}, total or 0, kind="fl")
    for index in range(1, made + 1):
        assert add_round(store, round_row(run_id, index))
        assert claim_round(store, run_id, index, "agg", stale_before=0.0)
        assert complete_round(store, run_id, index, "agg", aggregate_ms=1.0, accuracy=0.5 + index / 100)


def llm_job(store: Store, job_id: str, chat: bool, done: int, total: int) -> None:
    config: dict[str, Any] = {"model": GGUF, "input": "questions.jsonl", "generation": {"max_new_tokens": 64}}
    if chat:
        config["chat"] = True
    store.create_run(job_id, config["input"], config, 0, kind="llm")
    insert_prompts(
        store,
        [
            {
                "run_id": job_id,
                "key": f"q{i}",
                "line": i,
                "prompt_sha256": "0" * 64,
                "prompt": f"q{i}",
                "state": "pending",
            }
            for i in range(total)
        ],
    )
    with store.engine.begin() as connection:
        keys = [f"q{i}" for i in range(done)]
        connection.execute(
            update(LlmPromptRow).where(LlmPromptRow.run_id == job_id, LlmPromptRow.key.in_(keys)).values(state="done")
        )


def set_run(store: Store, run_id: str, **values: Any) -> None:
    with store.session() as session, session.begin():
        session.execute(update(RunRow).where(RunRow.id == run_id).values(**values))


LEASE_TTL_S = 600


def fill(store: Store) -> dict[str, str]:
    """The runs a user meets, by what each is: ids as fedqueue makes them."""
    now = time.time()
    ids = {
        "fedavg": "5d2f0c1a9b7e",
        "fedbuff": "8e1b7c2d4f60",
        "fedrevive": "a0c4e6f8b2d1",
        "left": "c3d5e7f9a1b2",
        "fresh": "e9f1a3b5c7d8",
        "plain": "llm-1a2b3c4d5e6f",
        "chat": "llm-6f5e4d3c2b1a",
    }
    fl_run(store, ids["fedavg"], "digits-fedavg", {}, 10, 10)
    store.finish_run(ids["fedavg"], "finished")
    set_run(store, ids["fedavg"], created_at=now - 3 * 86400)
    fl_run(store, ids["fedbuff"], "digits-fedbuff", {"mode": "fedbuff", "buffer_size": 10}, 500, 31)
    set_run(store, ids["fedbuff"], created_at=now - 2 * 3600)
    # A follower holds it (running) for as long as the test can take on a loaded machine.
    assert store.acquire_lease(ids["fedbuff"], "host:123", LEASE_TTL_S)
    config = {"mode": "fedrevive", "max_sim_time": 200.0, "dataset": "cifar10", "model": "resnet18_fedrevive"}
    fl_run(store, ids["fedrevive"], "fedrevive-cifar10-shifted-delays-seed-10", config, 50000, 47)
    store.finish_run(ids["fedrevive"], "finished")
    # Left after Ctrl-C: running in the store, its follower's lease ran out 20 minutes ago.
    fl_run(store, ids["left"], "digits-fedavg", {}, 200, 3)
    set_run(store, ids["left"], created_at=now - 1800, lease_owner="host:99", lease_expires_at=now - 1200)
    fl_run(store, ids["fresh"], "digits-fedbuff", {"mode": "fedbuff"}, 10, 0)  # submitted, not yet adopted
    llm_job(store, ids["plain"], chat=False, done=21, total=21)
    store.finish_run(ids["plain"], "finished")
    llm_job(store, ids["chat"], chat=True, done=7, total=21)
    store.finish_run(ids["chat"], "cancelled")
    return ids


def test_runs_at_80_columns_tells_each_run_apart(tmp_path: Path) -> None:
    database = tmp_path / "store.db"
    store = open_store(f"sqlite:///{database}", migrate=True)
    try:
        ids = fill(store)
    finally:
        store.close()
    # A lease long enough that the fresh run is not yet stalled however slowly the commands start.
    env = cli_env(FEDQUEUE_DATABASE_URL=f"sqlite:///{database}", COLUMNS="80", FEDQUEUE_LEASE_TTL_S=str(LEASE_TTL_S))
    result = fedqueue_cli("runs", cwd=tmp_path, env=env)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert max(len(line) for line in lines) <= 80, result.stdout
    assert lines[0].split() == ["id", "kind", "name", "progress", "acc", "state", "age"], result.stdout

    def row(what: str) -> list[str]:
        (found,) = [line for line in lines if line.startswith(ids[what] + " ")]
        return found.split()

    # kind, the name's both ends, progress, accuracy, state and age, one line each
    fedavg, fedbuff = row("fedavg"), row("fedbuff")
    assert fedavg[1] == "fedavg" and fedbuff[1] == "fedbuff"
    assert fedavg[2] == "digits-fedavg" and fedbuff[2].startswith("digits") and fedbuff[2].endswith("edbuff")
    assert fedavg[3:] == ["10/10", "rounds", "0.600", "finished", "3d"], result.stdout
    assert fedbuff[3:] == ["31/500", "v", "0.810", "running", "2h"], result.stdout
    fedrevive = row("fedrevive")
    assert fedrevive[1] == "fedrevive" and fedrevive[2].startswith("fed") and fedrevive[2].endswith("-10")
    assert fedrevive[3:-1] == ["47", "v", "·", "t≤200", "0.970", "finished"], result.stdout
    assert row("left")[-5:] == ["3/200", "rounds", "0.530", "stalled", "30m"], result.stdout
    assert row("fresh")[-4:-1] == ["0/10", "v", "running"], result.stdout  # no accuracy yet, not stalled yet
    plain, chat = row("plain"), row("chat")
    assert plain[1] == "llm" and plain[3:-1] == ["21/21", "prompts", "finished"], result.stdout
    assert chat[1:3] == ["llm", "chat"] and chat[4:-1] == ["7/21", "prompts", "cancelled"], result.stdout
    assert plain[2].startswith("quest") and chat[3] == plain[2]  # one file, told apart by their kind
    assert lines[-1] == "stalled: running, but nothing schedules it; fedqueue resume RUN carries it on"

    listed = {line["id"]: line for line in json.loads(fedqueue_cli("runs", "--json", cwd=tmp_path, env=env).stdout)}
    assert [id_ for id_, line in listed.items() if line["stalled"]] == [ids["left"]]
    assert listed[ids["left"]]["state"] == "running"  # the store's state, as it is
    assert listed[ids["chat"]]["type"] == "llm chat" and listed[ids["plain"]]["type"] == "llm"
    assert listed[ids["fedavg"]]["rounds"] == "10/10" and listed[ids["fedavg"]]["accuracy"] == 0.6

    # Wider, the data and model come in, a long GGUF path by its file name's end.
    wide = fedqueue_cli("runs", cwd=tmp_path, env={**env, "COLUMNS": "120"}).stdout.splitlines()
    assert max(len(line) for line in wide) <= 120 and "data · model" in wide[0]
    (chat_line,) = [line for line in wide if line.startswith(ids["chat"])]
    assert "Q8_0.gguf" in chat_line and GGUF not in chat_line


def test_a_run_is_stalled_only_when_running_past_the_grace_with_no_live_lease(tmp_path: Path) -> None:
    store = open_store(f"sqlite:///{tmp_path / 's.db'}", migrate=True)
    try:
        now = time.time()
        fl_run(store, "a", "", {}, 3, 0)
        set_run(store, "a", created_at=now - 60)

        def stalled() -> bool:
            (line,) = run_lines(store, store.list_runs(), now=now, lease_ttl_s=15)
            return bool(line["stalled"])

        assert stalled()  # never leased, a minute old: no launcher adopted it
        assert store.acquire_lease("a", "worker launcher h:1", 15)
        assert not stalled()
        set_run(store, "a", lease_expires_at=now - 1)
        assert stalled()
        set_run(store, "a", created_at=now - 10, lease_owner=None, lease_expires_at=None)
        assert not stalled()  # launchers adopt an unfollowed run once it is a lease's length old
        set_run(store, "a", created_at=now - 60)
        store.finish_run("a", "failed")
        assert not stalled()  # ended runs are what they are
    finally:
        store.close()


def test_names_keep_both_ends_paths_their_end_and_narrow_terminals_drop_columns() -> None:
    assert _shorten("digits-fedavg-long-sweep", 12, "name") == "digit…-sweep"
    assert _shorten("digits-fedbuff", 9, "name") == "digi…buff"
    assert _shorten(GGUF, 12, "what") == "…t-Q8_0.gguf"
    assert [age(s) for s in (5, 61, 7200, 3 * 86400)] == ["5s", "1m", "2h", "3d"]
    line = {
        "id": "5d2f0c1a9b7e",
        "name": "digits-fedavg",
        "type": "fedavg",
        "state": "running",
        "stalled": False,
        "progress": "3/10 rounds",
        "accuracy": 0.5,
        "dataset": "digits",
        "model": "mlp",
        "created_at": 100.0,
    }
    headers = [[column.header for column in runs_table([line], width, now=160.0).columns] for width in (120, 50, 30)]
    assert headers[0] == ["id", "kind", "name", "data · model", "progress", "acc", "state", "age"]
    # Narrower, the data and model go first, then the age, the accuracy, the progress, the name, the kind.
    assert headers[1] == ["id", "kind", "name", "state"]
    assert headers[2] == ["id", "kind", "state"]


@pytest.mark.sessions
def test_a_run_left_by_ctrl_c_with_its_workers_gone_is_stalled(tmp_path: Path) -> None:
    """`fedqueue run` with nothing configured, interrupted: its workers stop with it and the run stays stored as
    running. `runs` says stalled once the follower's lease has run out, not running."""
    config = tmp_path / "long.toml"
    config.write_text("num_devices = 20\ndevices_per_round = 4\nrounds = 500\nlocal_iters = 1\nseed = 1\n")
    env = cli_env(FEDQUEUE_LEASE_TTL_S="2", COLUMNS="80")
    process = subprocess.Popen(
        [*FEDQUEUE_CLI, "run", str(config), "--procs", "1"],
        stdin=subprocess.PIPE,  # no terminal: Ctrl-C leaves the run, without asking
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        cwd=tmp_path,
        text=True,
        preexec_fn=interruptible,
    )

    def lines() -> list[dict[str, Any]]:
        result = fedqueue_cli("runs", "--json", cwd=tmp_path, env=env)
        return json.loads(result.stdout) if result.returncode == 0 else []

    try:
        wait_until(lambda: any(line["rounds"] not in ("", "0/500") for line in lines()), 240)
        [running] = lines()
        assert running["state"] == "running" and not running["stalled"]  # its follower holds it
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 130, out + err
    wait_until(lambda: all(line["stalled"] for line in lines()), 60)
    [left] = lines()
    assert left["state"] == "running"
    table = fedqueue_cli("runs", cwd=tmp_path, env=env).stdout.splitlines()
    (row,) = [line for line in table if line.startswith(left["id"])]
    assert " stalled " in row and " running " not in row, table
