"""Pipelines' Python API: `fedqueue.llm.pipeline(items, program=..., model=...)`, over the kind-neutral fedqueue.api.

import fedqueue.llm
handle = fedqueue.llm.pipeline("items.jsonl", program="mypkg.refine:program", model="./my-model", max_steps=4)
print([row["result"] for row in handle.rows()])
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from dataclasses import fields
from pathlib import Path
from typing import Any

from fedqueue.api import RunHandle, with_plugins
from fedqueue.api import run as run_job
from fedqueue.config import DEFAULT_GPUS_PER_WORKER, DEFAULT_WORKER_SLOTS, Settings
from fedqueue.errors import ConfigError
from fedqueue.llm.export import check_out_folder
from fedqueue.llm.job import DEFAULT_BATCH_SIZE
from fedqueue.llm.pipelines.export import pipeline_rows, write_pipeline_export
from fedqueue.llm.pipelines.replay import DEFAULT_MAX_STEPS
from fedqueue.llm.pipelines.rows import pipeline_counts
from fedqueue.llm.pipelines.submission import PipelineSubmission
from fedqueue.llm.pipelines.submit import PipelineRequest, SubmittedPipeline
from fedqueue.llm.pipelines.summary import pipeline_summary
from fedqueue.llm.settings import GenerationSettings
from fedqueue.llm.submission import model_name
from fedqueue.llm.wake import stored_waiter

__all__ = ["PipelineHandle", "pipeline"]

ItemsLike = str | os.PathLike[str] | Iterable[Any]
PIPELINE_OPTIONS = ("max_steps", "batch_size", "job")
PYTHON_INPUT = Path("<items>")


class PipelineHandle(RunHandle):
    """One pipeline: its status, its progress and its items, read back from the store."""

    def __init__(self, run_id: str, settings: Settings, submitted: SubmittedPipeline | None = None) -> None:
        super().__init__(run_id, settings)
        self.submitted = submitted

    def status(self) -> dict[str, Any]:
        """What `fedqueue llm status --json` prints for a pipeline."""
        return pipeline_summary(self.store, self.id)

    def progress(self) -> dict[str, int]:
        """Items done, failed, running and in all; calls made; tokens."""
        return pipeline_counts(self.store, self.id)

    def rows(self) -> list[dict[str, Any]]:
        """One dict per item, in input order: id, line, state, result, error, steps, trace."""
        return pipeline_rows(self.store, self.id)

    def export(self, out: str | os.PathLike[str]) -> Path:
        path = Path(out)
        write_pipeline_export(self.store, self.id, path)
        return path


def pipeline_request(items: ItemsLike, program: str, model: str | os.PathLike[str], **options: Any) -> PipelineRequest:
    """A request: `options` are GenerationSettings' fields and max_steps, batch_size, job."""
    if not isinstance(program, str):
        raise ConfigError("program: expected an import path like mypkg.module:function")
    if not isinstance(model, str | os.PathLike) or not os.fspath(model).strip():
        raise ConfigError("model: expected a model folder, cached hub id or .gguf file, as a non-empty string")
    known = {field.name for field in fields(GenerationSettings)} | set(PIPELINE_OPTIONS)
    unknown = sorted(set(options) - known)
    if unknown:
        raise ConfigError(f"{unknown[0]}: unknown option (known: {', '.join(sorted(known))})")
    generation = GenerationSettings(**{k: v for k, v in options.items() if k not in PIPELINE_OPTIONS})
    if isinstance(items, str | os.PathLike):
        input_path, data = Path(items), None
    else:
        input_path, data = PYTHON_INPUT, _as_jsonl(items)
    return PipelineRequest(
        input_path=input_path,
        program=program,
        model=model_name(os.fspath(model)),
        generation=generation,
        max_steps=options.get("max_steps", DEFAULT_MAX_STEPS),
        batch_size=options.get("batch_size", DEFAULT_BATCH_SIZE),
        job=options.get("job"),
        input_data=data,
    )


def pipeline(
    items: ItemsLike,
    program: str,
    model: str | os.PathLike[str],
    *,
    settings: Settings | None = None,
    procs: int | None = None,
    slots: int = DEFAULT_WORKER_SLOTS,
    gpus_per_worker: int = DEFAULT_GPUS_PER_WORKER,
    plugin_path: list[str] | None = None,
    timeout_s: float | None = None,
    out: str | os.PathLike[str] | None = None,
    **options: Any,
) -> PipelineHandle:
    """Run `program` over every item and wait: a JSONL file of items, or the items themselves (JSON values).
    With no broker configured, on the cluster `fedqueue up` left running, else on local workers started here."""
    request = pipeline_request(items, program, model, **options)
    settings = with_plugins(settings, plugin_path)
    if out is not None:
        check_out_folder(Path(out))
    submission = PipelineSubmission(request)
    handle = run_job(
        submission,
        settings,
        procs=procs,
        slots=slots,
        gpus_per_worker=gpus_per_worker,
        wait_for_workers=True,
        timeout_s=timeout_s,
        pause=stored_waiter,  # the follower sees the end as soon as the last batch is stored
    )
    done = PipelineHandle(handle.id, handle.settings, submission.submitted)
    if out is not None:
        done.export(out)
    return done


def _as_jsonl(items: Iterable[Any]) -> bytes:
    if isinstance(items, str | bytes | dict):
        raise ConfigError(f"items: expected a path or a list of items, got one {type(items).__name__}")
    lines = []
    for index, item in enumerate(items):
        try:
            lines.append(json.dumps(item, ensure_ascii=False, allow_nan=False))
        except (TypeError, ValueError) as error:
            raise ConfigError(f"items[{index}]: not JSON data ({error})") from None
    if not lines:
        raise ConfigError("items: empty (give at least one item)")
    return "".join(line + "\n" for line in lines).encode()
