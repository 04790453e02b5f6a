"""An LLM job's results: one row per input line, in input order, as Python dicts or a JSONL file. No torch."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from fedqueue.errors import ConfigError
from fedqueue.llm.results import prompt_rows
from fedqueue.store import Store


def export_rows(store: Store, job_id: str) -> list[dict[str, Any]]:
    """id, line, state (done, failed or pending), output, prompt_tokens, generated_tokens, finish_reason, error."""
    return [
        {
            "id": row.input_id,
            "line": row.line,
            "state": row.state,
            "output": row.output,
            "prompt_tokens": row.prompt_tokens,
            "generated_tokens": row.generated_tokens,
            "finish_reason": row.finish_reason,
            "error": row.error,
        }
        for row in prompt_rows(store, job_id)
    ]


def write_export(store: Store, job_id: str, out: Path, field: str = "out") -> list[dict[str, Any]]:
    """The job's rows as JSON lines, written whole to `out` (`field` names it in errors); the rows written."""
    rows = export_rows(store, job_id)
    write_atomically(out, "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows), field)
    return rows


def check_out_folder(path: Path, field: str = "out") -> Path:
    """The folder `path` is written into; a ConfigError naming `field` when it is not there."""
    folder = path.parent if str(path.parent) else Path(".")
    if not folder.is_dir():
        raise ConfigError(f"{field} {path}: folder {folder} does not exist")
    return folder


def write_atomically(path: Path, text: str, field: str = "out") -> None:
    """Write beside the target and rename over it: a reader never sees half a file."""
    folder = check_out_folder(path, field)
    handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", dir=folder)
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as file:
            file.write(text)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
