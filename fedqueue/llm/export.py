"""An LLM job's results: one row per input line, in input order, as Python dicts or a JSONL file. No torch."""

from __future__ import annotations

import json
import os
import secrets
import stat
from pathlib import Path
from typing import Any

from fedqueue.errors import ConfigError
from fedqueue.llm.results import prompt_rows
from fedqueue.store import Store


def export_rows(store: Store, job_id: str) -> list[dict[str, Any]]:
    """id, line, state (done, failed or pending), output, prompt_tokens, generated_tokens, finish_reason, error.

    A line without an id is named by its line number, as the input's documentation says.
    """
    return [
        {
            "id": row.line if row.input_id is None else row.input_id,
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
    """The folder `path` is written into; a ConfigError naming `field` when it is not there, or `path` is one."""
    folder = path.parent if str(path.parent) else Path(".")
    if not folder.is_dir():
        raise ConfigError(f"{field} {path}: folder {folder} does not exist")
    if path.is_dir():
        raise ConfigError(f"{field} {path}: is a folder; give the name of the file to write")
    return folder


def write_atomically(path: Path, text: str, field: str = "out") -> None:
    """Write beside the target and rename over it: a reader never sees half a file.

    A new file gets the permissions any new file gets here (0666 less the umask); a file replaced keeps its own.
    """
    folder = check_out_folder(path, field)
    try:
        mode = stat.S_IMODE(path.stat().st_mode)
    except FileNotFoundError:
        mode = None
    except OSError as error:
        raise ConfigError(f"{field} {path}: cannot write it ({error.strerror})") from None
    temporary, handle = _create_beside(path, folder, field)
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as file:
            if mode is not None:
                os.fchmod(file.fileno(), mode)
            file.write(text)
            file.flush()
            os.fsync(file.fileno())  # the data is on disk before the name points at it
        os.replace(temporary, path)
    except OSError as error:
        temporary.unlink(missing_ok=True)
        raise ConfigError(f"{field} {path}: cannot write it ({error.strerror or error})") from None
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise


def _create_beside(path: Path, folder: Path, field: str) -> tuple[Path, int]:
    """A new file of a name of its own in `folder`, open for writing, created as open() creates files (the umask
    applies, where mkstemp would give 0600)."""
    for _ in range(100):
        temporary = folder / f".{path.name}.{secrets.token_hex(4)}.tmp"
        try:
            return temporary, os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        except FileExistsError:
            continue
        except OSError as error:
            raise ConfigError(f"{field} {path}: cannot write in {folder} ({error.strerror})") from None
    raise ConfigError(f"{field} {path}: cannot create a file beside it in {folder}")
