"""GGUF models converted once per host into the model cache, and read from there by every later load."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import fedqueue.llm.converted as converted_module
from fedqueue.config import Settings
from fedqueue.llm.api import job_request
from fedqueue.llm.converted import MARKER, cache_root, converted, entry_name
from fedqueue.llm.model import load_model
from fedqueue.llm.submission import prepare

# Each process waits until both are ready, so their conversions overlap; then prints whether it converted.
TWO_AT_ONCE = """
import sys, time
from pathlib import Path
import torch
from fedqueue.llm.converted import converted

gguf, root, ready, me = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]), sys.argv[4]
(ready / me).touch()
deadline = time.monotonic() + 120
while len(list(ready.iterdir())) < 2 and time.monotonic() < deadline:
    time.sleep(0.01)
print(converted(gguf, torch.float32, root).converted_here)
"""


def entries(root: Path) -> list[str]:
    return sorted(path.name for path in root.iterdir() if path.is_dir())


def test_a_second_load_is_served_from_the_cache_with_the_files_weights(
    tiny_gguf_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "cache"
    direct = load_model(str(tiny_gguf_path))  # the GGUF file read by transformers, no cache
    first = load_model(str(tiny_gguf_path), cache=root)
    [entry] = entries(root)
    assert entry == entry_name(tiny_gguf_path, "float32") and entry.startswith("tiny-float32-")
    source = json.loads((root / entry / MARKER).read_text())
    assert source == {"gguf": str(tiny_gguf_path.resolve()), "size": tiny_gguf_path.stat().st_size, "dtype": "float32"}
    assert (root / entry / "model.safetensors").is_file() and (root / entry / "tokenizer.json").is_file()

    # A later load converts nothing: with conversion broken it still loads, from the cache's folder.
    def no_conversion(*_: object) -> None:
        raise AssertionError("converted again")

    monkeypatch.setattr(converted_module, "_convert", no_conversion)
    second = load_model(str(tiny_gguf_path), cache=root)
    assert second.name == str(tiny_gguf_path) and entries(root) == [entry]
    for loaded in (first, second):
        expected, got = direct.model.state_dict(), loaded.model.state_dict()
        assert got.keys() == expected.keys()
        assert all(torch.equal(got[name], expected[name]) for name in expected)
        assert loaded.tokenizer("the tiny text")["input_ids"] == direct.tokenizer("the tiny text")["input_ids"]
        assert loaded.tokenizer.chat_template == direct.tokenizer.chat_template
        assert loaded.context_length == direct.context_length == 256


def test_a_changed_file_or_dtype_gets_its_own_entry(tiny_gguf_path: Path, tmp_path: Path) -> None:
    copy = tmp_path / "tiny.gguf"
    copy.write_bytes(tiny_gguf_path.read_bytes())
    before = entry_name(copy, "float32")
    assert entry_name(copy, "bfloat16") != before
    copy.write_bytes(copy.read_bytes() + b"\0")  # another size (and modification time): another model
    assert entry_name(copy, "float32") != before


def test_two_processes_loading_at_once_convert_once(tiny_gguf_path: Path, tmp_path: Path) -> None:
    root, ready = tmp_path / "cache", tmp_path / "ready"
    ready.mkdir()
    script = tmp_path / "load.py"
    script.write_text(TWO_AT_ONCE)
    processes = [
        subprocess.Popen(
            [sys.executable, str(script), str(tiny_gguf_path), str(root), str(ready), name],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name in ("a", "b")
    ]
    results = [process.communicate(timeout=240) for process in processes]
    assert [process.returncode for process in processes] == [0, 0], [err[-2000:] for _, err in results]
    assert sorted(out.strip().splitlines()[-1] for out, _ in results) == ["False", "True"]
    assert entries(root) == [entry_name(tiny_gguf_path, "float32")]  # one folder, no half-written one left


def test_a_conversion_killed_half_way_is_redone(tiny_gguf_path: Path, tmp_path: Path) -> None:
    root = tmp_path / "cache"
    name = entry_name(tiny_gguf_path, "float32")
    (root / f".{name}.999999.partial").mkdir(parents=True)  # what a killed conversion leaves
    (root / name).mkdir()  # a folder without the marker is not whole
    result = converted(tiny_gguf_path, torch.float32, root)
    assert result.converted_here and (result.folder / MARKER).is_file()
    assert sorted(path.name for path in root.iterdir()) == [name, f"{name}.lock"]


def test_the_cache_folder_follows_the_setting() -> None:
    assert cache_root("off") is None
    assert cache_root("/somewhere/models") == Path("/somewhere/models")
    assert cache_root(None) is not None and cache_root(None).parts[-2:] == ("fedqueue", "models")  # type: ignore[union-attr]
    assert Settings.from_env({"FEDQUEUE_MODEL_CACHE": "off"}).model_cache == "off"
    assert Settings(model_cache="/m").to_env()["FEDQUEUE_MODEL_CACHE"] == "/m"


def test_a_submit_whose_workers_run_here_starts_converting_before_they_start(
    tiny_gguf_path: Path, tmp_path: Path
) -> None:
    root = tmp_path / "cache"
    settings = Settings(database_url=f"sqlite:///{tmp_path / 'jobs.db'}", model_cache=str(root))
    submission = prepare(job_request(["hello"], tiny_gguf_path, dtype="float32", chat=True), settings, ask_slots=False)
    assert submission.converting is not None  # started while the caller goes on to start workers and plan
    assert submission.converting.wait(timeout=240) == 0
    assert entries(root) == [entry_name(tiny_gguf_path, "float32")]
    assert (root / entries(root)[0] / MARKER).is_file()
    # With the workers elsewhere (a broker configured), nothing is converted here.
    remote = Settings(broker_url="redis://127.0.0.1:1/0", database_url=settings.database_url, model_cache=str(root))
    assert prepare(job_request(["hello"], tiny_gguf_path, chat=True), remote, ask_slots=False).converting is None
