"""`fedqueue llm pipeline` as a user runs it: bad programs refused in one line, failed items beside done ones."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.cli_inputs import cli_env
from tests.support.cli_runner import fedqueue_cli
from tests.support.own_processes import ProcessMark
from tests.support.reliability_support import PLUGINS


def write_items(path: Path, count: int, bad: set[int] = frozenset()) -> Path:  # type: ignore[assignment]
    path.write_text(
        "".join(json.dumps({"id": f"t{n}", "topic": f"t{n}", "bad": n in bad}) + "\n" for n in range(count))
    )
    return path


@pytest.mark.parametrize(
    ("program", "extra", "field"),
    [
        ("no_such_module_here:program", (), "--program: cannot import 'no_such_module_here'"),
        ("fq_pipelines:not_a_generator", (), "--program: fq_pipelines:not_a_generator is not a generator function"),
        ("fq_pipelines:missing", (), "--program: module 'fq_pipelines' has no attribute 'missing'"),
        ("fq_pipelines:refine", ("--max-steps", "0"), "--max-steps: must be an integer from 1"),
        ("fq_pipelines:refine", ("--temperature", "-1"), "temperature: must be a number"),
    ],
)
def test_a_bad_program_or_option_is_one_line_exit_2_and_writes_nothing(
    tmp_path: Path, tiny_model_path: Path, program: str, extra: tuple[str, ...], field: str
) -> None:
    items = write_items(tmp_path / "items.jsonl", 3)
    database = tmp_path / "store.db"
    env = cli_env(FEDQUEUE_DATABASE_URL=f"sqlite:///{database}")
    args = ("llm", "pipeline", str(items), "--program", program, "--model", str(tiny_model_path))
    result = fedqueue_cli(*args, "--plugin-path", str(PLUGINS), *extra, cwd=tmp_path, env=env)
    assert result.returncode == 2, result.stdout + result.stderr
    errors = result.stderr.strip().splitlines()
    assert len(errors) == 1 and field in errors[0], result.stderr
    assert "Traceback" not in result.stdout + result.stderr and "embedded Redis" not in result.stdout
    assert not database.exists()


def test_a_bad_item_line_is_refused_naming_it(tmp_path: Path, tiny_model_path: Path) -> None:
    items = tmp_path / "items.jsonl"
    items.write_text('{"id": "a"}\n{oops\n')
    args = ("llm", "pipeline", str(items), "--program", "fq_pipelines:refine", "--model", str(tiny_model_path))
    result = fedqueue_cli(*args, "--plugin-path", str(PLUGINS), cwd=tmp_path, env=cli_env())
    assert (
        result.returncode == 2
        and result.stderr.strip()
        == f"error: input {items}: line 2: not valid JSON (Expecting property name enclosed in double quotes)"
    )


@pytest.mark.sessions
def test_a_pipeline_with_failing_items_exits_3_and_exports_every_trace(tmp_path: Path, tiny_model_path: Path) -> None:
    mark = ProcessMark(tmp_path)
    items = write_items(tmp_path / "items.jsonl", 8, bad={2, 5})
    out = tmp_path / "out.jsonl"
    result = fedqueue_cli(
        "llm",
        "pipeline",
        str(items),
        "--program",
        "fq_pipelines:raises",
        "--model",
        str(tiny_model_path),
        "--max-new-tokens",
        "6",
        "--plugin-path",
        str(PLUGINS),
        "--procs",
        "2",
        "-o",
        str(out),
        cwd=tmp_path,
        env=mark.env(cli_env()),
        timeout=240,
    )
    assert result.returncode == 3, result.stdout + result.stderr
    assert "2 items failed (exit 3)" in result.stderr and "Traceback" not in result.stdout + result.stderr
    assert mark.alive() == set()
    job = next(line.split()[1] for line in result.stdout.splitlines() if line.startswith("pipeline "))
    status = json.loads(fedqueue_cli("llm", "status", job, "--json", cwd=tmp_path, env=cli_env()).stdout)
    assert (status["state"], status["done"], status["failed"], status["calls"]) == ("finished", 6, 2, 8)
    assert [error["id"] for error in status["errors"]] == ["t2", "t5"]
    assert all(error["error"].startswith("ValueError: no good") for error in status["errors"])
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [row["id"] for row in rows] == [f"t{n}" for n in range(8)]
    for row in rows:
        assert row["steps"] == 1 and row["trace"][0]["request"] == {"prompt": f"Start {row['id']}"}
        if row["state"] == "failed":
            assert "Traceback" in row["error"] and row["result"] is None
        else:
            assert row["result"] == row["trace"][0]["output"] and row["error"] is None
    runs = fedqueue_cli("runs", cwd=tmp_path, env=cli_env()).stdout
    assert "llm pipeline" in runs and "8/8 items" in runs
