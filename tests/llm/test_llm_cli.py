"""`fedqueue llm ...` as a user runs it: embedded Redis when nothing is configured, one-line errors, exports."""

from __future__ import annotations

import json
import os
import shutil
import stat
import uuid
from pathlib import Path

import pytest
import redis

from tests.support.cli_inputs import cli_env
from tests.support.cli_runner import fedqueue_cli
from tests.support.own_processes import ProcessMark


def write_prompts(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.sessions
def test_submit_with_nothing_configured_then_status_and_export(tmp_path: Path, tiny_model_path: Path) -> None:
    mark = ProcessMark(tmp_path)
    prompts = [json.dumps({"id": f"q{i}", "prompt": "Say " + "a" * i}) for i in range(12)]
    lines = [*prompts[:5], "{bad", *prompts[5:], json.dumps({"prompt": "No id here"})]
    lines.append(json.dumps({"id": "long", "prompt": "x" * 400}))  # over the tiny model's 256-token context
    input_path = write_prompts(tmp_path / "in.jsonl", lines)
    with input_path.open("ab") as file:
        file.write(b'{"prompt": "caf\xe9"}\n')  # Latin-1, not UTF-8: line 16 alone fails
    args = ("llm", "submit", str(input_path), "--model", str(tiny_model_path), "--max-new-tokens", "8")
    first_out = tmp_path / "first.jsonl"
    result = fedqueue_cli(
        *args,
        "--batch-size",
        "4",
        "--procs",
        "2",
        "-o",
        str(first_out),
        cwd=tmp_path,
        env=mark.env(cli_env()),
        timeout=240,
    )
    # Finished, with failed prompts: its own exit code, and the count.
    assert result.returncode == 3, result.stdout + result.stderr
    job = job_id(tmp_path)
    assert f"3 of 16 prompts failed (exit 3); each with its error: fedqueue llm export {job}" in (result.stderr)
    assert "embedded Redis at redis://127.0.0.1:" in result.stdout
    assert "batches for 2 worker slots" in result.stdout  # planned for the local workers it started
    assert "line 6: not valid JSON" in result.stderr  # the bad line is named, the job goes on
    assert "line 15: prompt has 401 tokens; with max_new_tokens 8 it exceeds the model's context of 256" in (
        result.stderr  # counted at submit: no batch spent on it
    )
    assert "line 16: not UTF-8 text (byte 0xe9 at column 16)" in result.stderr
    # The tiny model has a chat template: plain prompts get a hint (see test_llm_api for --chat itself).
    assert "is a chat model (its tokenizer has a chat template) and 14 of 14 prompts are plain text" in (
        result.stderr.replace("\n", " ")
    )
    assert "Traceback" not in result.stdout + result.stderr
    assert mark.alive() == set()  # its embedded Redis and workers stopped with it
    status = json.loads(fedqueue_cli("status", job, "--json", cwd=tmp_path, env=cli_env()).stdout)
    assert (status["kind"], status["state"], status["done"], status["failed"]) == ("llm", "finished", 13, 3)
    assert status["generated_tokens"] == 13 * 8 and len(status["workers"]) >= 1
    assert status["errors"][0] == {
        "line": 6,
        "id": None,
        "error": "not valid JSON (Expecting property name enclosed in double quotes at column 2)",
    }
    assert [error["line"] for error in status["errors"]] == [6, 15, 16]

    out = tmp_path / "out.jsonl"
    exported = fedqueue_cli("llm", "export", job, "-o", str(out), cwd=tmp_path, env=cli_env())
    assert exported.returncode == 0, exported.stderr
    umask = os.umask(0o022)
    os.umask(umask)
    assert stat.S_IMODE(out.stat().st_mode) == 0o666 & ~umask  # the usual permissions, not 0600
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [row["line"] for row in rows] == list(range(1, 17))  # input order, the bad lines in their places
    # A line without an id is exported under its line number, as documented.
    assert [row["id"] for row in rows] == [
        *(f"q{i}" for i in range(5)),
        6,
        *(f"q{i}" for i in range(5, 12)),
        14,
        "long",
        16,
    ]
    assert [row["state"] for row in rows] == ["done"] * 5 + ["failed"] + ["done"] * 8 + ["failed"] * 2
    assert all(row["output"] and row["generated_tokens"] == 8 for row in rows if row["state"] == "done")
    assert (rows[14]["id"], rows[14]["prompt_tokens"], rows[14]["generated_tokens"]) == ("long", 401, 0)
    # `submit -o` wrote the same export when the job ended.
    assert [json.loads(line) for line in first_out.read_text().splitlines()] == rows

    # The same input and model again: nothing left to generate, the stored rows stay as they were.
    again = fedqueue_cli(*args, "--batch-size", "4", "--procs", "1", cwd=tmp_path, env=cli_env(), timeout=240)
    assert again.returncode == 3, again.stderr
    assert "continued: 13 prompts, 0 to generate" in again.stdout
    exported = fedqueue_cli("llm", "export", job, "-o", str(out), cwd=tmp_path, env=cli_env())
    assert [json.loads(line) for line in out.read_text().splitlines()] == rows


def job_id(folder: Path) -> str:
    """The one job of the store in `folder` (the default store of a command run there)."""
    [job] = json.loads(fedqueue_cli("runs", "--json", cwd=folder, env=cli_env()).stdout)
    return str(job["id"])


@pytest.mark.parametrize(
    ("extra", "lines", "field"),
    [
        ((), None, "no such file"),
        (("--strict",), ['{"prompt": "fine"}', '{"prompt": 3}'], "line 2: prompt"),
        # Counted by the model's tokenizer at submit, not found once a worker has loaded the model.
        (("--strict",), ['{"prompt": "fine"}', json.dumps({"prompt": "x" * 400})], "line 2: prompt has 401 tokens"),
        (("--strict",), b'{"prompt": "fine"}\n{"prompt": "caf\xe9"}\n', "line 2: not UTF-8 text (byte 0xe9"),
        ((), ["", "  "], "no prompts in it"),
        (("--batch-size", "0"), ['{"prompt": "a"}'], "--batch-size"),
        (("--max-new-tokens", "0"), ['{"prompt": "a"}'], "max_new_tokens"),
        (("--temperature", "-1"), ['{"prompt": "a"}'], "temperature"),
        (("--job", "bad name!"), ['{"prompt": "a"}'], "--job"),
        (("--dtype", "int3"), ['{"prompt": "a"}'], "dtype"),
        (("--backend", "vllm"), ['{"prompt": "a"}'], "--backend vllm"),  # not installed, and workers start here
        (("--backend", "onnx"), ['{"prompt": "a"}'], "backend: must be one of transformers, vllm"),
    ],
)
def test_bad_input_is_one_line_exit_2_and_writes_nothing(
    tmp_path: Path, tiny_model_path: Path, extra: tuple[str, ...], lines: list[str] | bytes | None, field: str
) -> None:
    input_path = tmp_path / "in.jsonl"
    if isinstance(lines, bytes):
        input_path.write_bytes(lines)
    elif lines is not None:
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
    for model in ("./no-such-model", "nobody/no-such-model", "not a hub id"):  # the last was a traceback
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
@pytest.mark.parametrize("placement", [(), ("--broker",), ("--broker", "--detach")])
def test_an_unloadable_model_is_refused_at_submit(
    request: pytest.FixtureRequest,
    tmp_path: Path,
    tiny_model_path: Path,
    kind: str,
    missing: str,
    placement: tuple[str, ...],
) -> None:
    """Not a job stored "finished" with 0 done once every batch failed on the workers: one line, exit 2. With a
    broker configured too (the workers elsewhere name the same path): not a warning and a job written."""
    model = unloadable_model(kind, tmp_path / "model", tiny_model_path)
    input_path = write_prompts(tmp_path / "in.jsonl", ['{"prompt": "a"}'])
    database = tmp_path / "store.db"
    env = cli_env(FEDQUEUE_DATABASE_URL=f"sqlite:///{database}")
    if "--broker" in placement:
        prefix = f"fqtest-{uuid.uuid4().hex[:8]}"  # this test's own: nothing may be written under it
        env.update(FEDQUEUE_BROKER_URL=request.getfixturevalue("redis_url"), FEDQUEUE_KEY_PREFIX=prefix)
    flags = [flag for flag in placement if flag != "--broker"]
    result = fedqueue_cli("llm", "submit", str(input_path), "--model", str(model), *flags, cwd=tmp_path, env=env)
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stderr.startswith(f"error: --model {model}: {missing}"), result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr
    assert "embedded Redis" not in result.stdout and not database.exists()  # no worker started, no job row
    if "--broker" in placement:
        client = redis.Redis.from_url(env["FEDQUEUE_BROKER_URL"])
        written = list(client.scan_iter(match=f"{prefix}*"))
        if written:
            client.delete(*written)
        client.close()
        # Only the bindings of the question asked of the workers (their slots), no task, no job.
        assert all(b":_kombu." in key for key in written), written


def test_export_of_an_fl_run_or_unknown_job_is_one_line(tmp_path: Path) -> None:
    result = fedqueue_cli("llm", "export", "nope", "-o", str(tmp_path / "x.jsonl"), cwd=tmp_path, env=cli_env())
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "x.jsonl").exists()
