"""What a newcomer meets, in the order they meet it: the version, a first FL run on nothing configured and
the lines it ends with, a first LLM job, `runs` on an 80-column terminal, and the usual mistakes, each
refused in one line with its exit code and no traceback. (Cancelling a running run or job, with nothing
running 10 s later, is tests/cli/test_cancel.py's.)"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from fedqueue.llm.tiny import build_tiny_llama
from tests.support.cli_inputs import cli_env
from tests.support.cli_runner import fedqueue_cli

pytestmark = pytest.mark.sessions  # `make test-sessions`

REPO = Path(__file__).resolve().parents[2]


def test_a_newcomer_s_first_commands(tmp_path: Path) -> None:
    version = fedqueue_cli("--version", cwd=tmp_path, env=cli_env())
    assert version.returncode == 0 and re.fullmatch(r"fedqueue \S+\n", version.stdout), version.stdout

    # The demo's config, shortened: everything started and stopped by the command itself.
    run = fedqueue_cli(
        "run", str(REPO / "examples" / "digits_fedavg.toml"), "--set", "rounds=2", "--procs", "2",
        cwd=tmp_path, env=cli_env(), timeout=240,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    [run_id] = [row["id"] for row in json.loads(fedqueue_cli("runs", "--json", cwd=tmp_path, env=cli_env()).stdout)]
    last = run.stdout.strip().splitlines()[-2:]
    assert last[0].startswith("results: in the store fedqueue.db"), last
    assert f"report {run_id}" in last[1] and f"status {run_id}" in last[1] and last[1].endswith("runs"), last

    model = build_tiny_llama(tmp_path / "tiny-llama")
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"q{i}", "prompt": f"Count to {i}"}) + "\n" for i in range(6)))
    job = fedqueue_cli(
        "llm", "submit", str(prompts), "--model", str(model), "--max-new-tokens", "4", "--chat", "--procs", "2",
        cwd=tmp_path, env=cli_env(), timeout=240,
    )  # fmt: skip
    assert job.returncode == 0, job.stdout + job.stderr

    rows = json.loads(fedqueue_cli("runs", "--json", cwd=tmp_path, env=cli_env()).stdout)
    assert {row["state"] for row in rows} == {"finished"} and len(rows) == 2
    table = fedqueue_cli("runs", cwd=tmp_path, env=cli_env(COLUMNS="80"))
    assert table.returncode == 0 and max(len(line) for line in table.stdout.splitlines()) <= 80
    for row in rows:  # every id whole, with its state
        assert any(row["id"] in line and "finished" in line for line in table.stdout.splitlines()), table.stdout

    # The usual mistakes: one line each, exit 2, nothing stored, no traceback.
    bad_config = tmp_path / "bad.toml"
    bad_config.write_text("rounds = 0\n")
    empty_model = tmp_path / "empty-model"
    empty_model.mkdir()
    mistakes = [
        (("run", "missing[v2].toml"), {}, "missing[v2].toml"),
        (("run", str(bad_config)), {}, "rounds"),
        (("status", "no-such-run"), {}, "no-such-run"),
        (("cancel", run_id), {}, run_id),  # it has ended: nothing to cancel
        (
            ("submit", str(REPO / "examples" / "digits_fedavg.toml")),
            {"FEDQUEUE_BROKER_URL": "redis://h:abc/0"},
            "FEDQUEUE_BROKER_URL",
        ),
        (("llm", "submit", str(prompts), "--model", str(empty_model)), {}, str(empty_model)),
    ]
    for args, env, named in mistakes:
        result = fedqueue_cli(*args, cwd=tmp_path, env=cli_env(**env), timeout=60)
        said = result.stdout + result.stderr
        assert result.returncode == 2, (args, said)
        assert named in said and "Traceback" not in said, (args, said)
    assert len(json.loads(fedqueue_cli("runs", "--json", cwd=tmp_path, env=cli_env()).stdout)) == 2
