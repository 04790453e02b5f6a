"""`fedqueue llm ...` as a user runs it: embedded Redis when nothing is configured, one-line errors, exports."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.cli_runner import fedqueue_cli
from tests.test_cli import cli_env, our_processes


def write_prompts(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n")
    return path


def test_submit_with_nothing_configured_then_status_and_export(tmp_path: Path, tiny_model_path: Path) -> None:
    before = our_processes()
    prompts = [json.dumps({"id": f"q{i}", "prompt": "Say " + "a" * i}) for i in range(12)]
    input_path = write_prompts(tmp_path / "in.jsonl", [*prompts[:5], "{bad", *prompts[5:]])
    args = ("llm", "submit", str(input_path), "--model", str(tiny_model_path), "--max-new-tokens", "8")
    first_out = tmp_path / "first.jsonl"
    result = fedqueue_cli(
        *args, "--batch-size", "4", "--procs", "2", "-o", str(first_out), cwd=tmp_path, env=cli_env(), timeout=240
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "embedded Redis at redis://127.0.0.1:" in result.stdout
    assert "batches for 2 worker slots" in result.stdout  # planned for the local workers it started
    assert "line 6: not valid JSON" in result.stderr  # the bad line is named, the job goes on
    assert our_processes() - before == set()
    [job] = json.loads(fedqueue_cli("runs", "--json", cwd=tmp_path, env=cli_env()).stdout)
    status = json.loads(fedqueue_cli("status", job["id"], "--json", cwd=tmp_path, env=cli_env()).stdout)
    assert (status["kind"], status["state"], status["done"], status["failed"]) == ("llm", "finished", 12, 1)
    assert status["generated_tokens"] == 12 * 8 and len(status["workers"]) >= 1
    assert status["errors"] == [
        {
            "line": 6,
            "id": None,
            "error": "not valid JSON (Expecting property name enclosed in double quotes at column 2)",
        }
    ]

    out = tmp_path / "out.jsonl"
    exported = fedqueue_cli("llm", "export", job["id"], "-o", str(out), cwd=tmp_path, env=cli_env())
    assert exported.returncode == 0, exported.stderr
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert [line["line"] for line in lines] == list(range(1, 14))  # input order, the bad line in its place
    assert [line["id"] for line in lines if line["state"] == "done"] == [f"q{i}" for i in range(12)]
    assert all(line["output"] and line["generated_tokens"] == 8 for line in lines if line["state"] == "done")
    # `submit -o` wrote the same export when the job ended.
    assert [json.loads(line) for line in first_out.read_text().splitlines()] == lines

    # The same input and model again: nothing left to generate, the stored rows stay as they were.
    again = fedqueue_cli(*args, "--batch-size", "4", "--procs", "1", cwd=tmp_path, env=cli_env(), timeout=240)
    assert again.returncode == 0, again.stderr
    assert "continued: 12 prompts, 0 to generate" in again.stdout
    exported = fedqueue_cli("llm", "export", job["id"], "-o", str(out), cwd=tmp_path, env=cli_env())
    assert [json.loads(line) for line in out.read_text().splitlines()] == lines


@pytest.mark.parametrize(
    ("extra", "lines", "field"),
    [
        ((), None, "no such file"),
        (("--strict",), ['{"prompt": "fine"}', '{"prompt": 3}'], "line 2: prompt"),
        ((), ["", "  "], "no prompts in it"),
        (("--batch-size", "0"), ['{"prompt": "a"}'], "--batch-size"),
        (("--max-new-tokens", "0"), ['{"prompt": "a"}'], "max_new_tokens"),
        (("--temperature", "-1"), ['{"prompt": "a"}'], "temperature"),
        (("--job", "bad name!"), ['{"prompt": "a"}'], "--job"),
        (("--dtype", "int3"), ['{"prompt": "a"}'], "dtype"),
        (("--backend", "vllm"), ['{"prompt": "a"}'], "--backend vllm"),  # not installed, and workers start here
    ],
)
def test_bad_input_is_one_line_exit_2_and_writes_nothing(
    tmp_path: Path, tiny_model_path: Path, extra: tuple[str, ...], lines: list[str] | None, field: str
) -> None:
    input_path = tmp_path / "in.jsonl"
    if lines is not None:
        write_prompts(input_path, lines)
    database = tmp_path / "store.db"
    env = cli_env(FEDQUEUE_DATABASE_URL=f"sqlite:///{database}")
    result = fedqueue_cli(
        "llm", "submit", str(input_path), "--model", str(tiny_model_path), *extra, cwd=tmp_path, env=env
    )
    assert result.returncode == 2, result.stdout + result.stderr
    errors = result.stderr.strip().splitlines()
    assert len(errors) == 1 and field in errors[0], result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    assert not database.exists()


def test_a_missing_model_is_refused_before_workers_start(tmp_path: Path) -> None:
    input_path = write_prompts(tmp_path / "in.jsonl", ['{"prompt": "a"}'])
    for model in ("./no-such-model", "nobody/no-such-model"):
        result = fedqueue_cli("llm", "submit", str(input_path), "--model", model, cwd=tmp_path, env=cli_env())
        assert result.returncode == 2 and result.stderr.startswith(f"error: --model {model}: "), result.stderr
        assert "embedded Redis" not in result.stdout


def unloadable_model(kind: str, folder: Path, tiny_model_path: Path) -> Path:
    """A model path that is there but holds no model that can be loaded."""
    if kind == "empty-folder":
        folder.mkdir()
    elif kind == "text-file":
        folder.write_text("not a model\n")
    elif kind == "not-gguf":
        folder = folder.with_suffix(".gguf")
        folder.write_bytes(b"PK\x03\x04 a zip file")
    else:  # a model folder without its weights
        shutil.copytree(
            tiny_model_path, folder, ignore=lambda _, names: [n for n in names if n.endswith(".safetensors")]
        )
    return folder


@pytest.mark.parametrize(
    ("kind", "missing"),
    [
        ("empty-folder", "an empty folder: no config.json, no weights"),
        ("text-file", "a file, not a model"),
        ("not-gguf", "not a GGUF file"),
        ("no-weights", "not a model folder: no weights (*.safetensors or pytorch_model.bin) in it"),
    ],
)
def test_an_unloadable_model_is_refused_at_submit(
    tmp_path: Path, tiny_model_path: Path, kind: str, missing: str
) -> None:
    """Not a job stored "finished" with 0 done once every batch failed on the workers: one line, exit 2."""
    model = unloadable_model(kind, tmp_path / "model", tiny_model_path)
    input_path = write_prompts(tmp_path / "in.jsonl", ['{"prompt": "a"}'])
    database = tmp_path / "store.db"
    env = cli_env(FEDQUEUE_DATABASE_URL=f"sqlite:///{database}")
    result = fedqueue_cli("llm", "submit", str(input_path), "--model", str(model), cwd=tmp_path, env=env)
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stderr.startswith(f"error: --model {model}: {missing}"), result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr
    assert "embedded Redis" not in result.stdout and not database.exists()  # no worker started, no job row


def test_export_of_an_fl_run_or_unknown_job_is_one_line(tmp_path: Path) -> None:
    result = fedqueue_cli("llm", "export", "nope", "-o", str(tmp_path / "x.jsonl"), cwd=tmp_path, env=cli_env())
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "x.jsonl").exists()
