"""`fedqueue llm pipeline ITEMS --program mypkg.refine:program --model ...`: run a program over every item and
follow it to the end; `fedqueue llm status` and `export` show pipelines as well as batch jobs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from fedqueue.cli.common import (
    GpusPerWorkerOpt,
    PluginPathOpt,
    ProcsOpt,
    SlotsOpt,
    console,
    error_console,
    friendly_errors,
)
from fedqueue.cli.launch import exit_unless_finished, submit_and_follow, submit_detached
from fedqueue.cli.local import with_local_broker
from fedqueue.config import DEFAULT_GPUS_PER_WORKER, DEFAULT_WORKER_SLOTS, Settings
from fedqueue.errors import ConfigError
from fedqueue.llm.export import check_out_folder
from fedqueue.llm.job import DEFAULT_BATCH_SIZE
from fedqueue.llm.pipelines.export import write_pipeline_export
from fedqueue.llm.pipelines.replay import DEFAULT_MAX_STEPS
from fedqueue.llm.pipelines.rows import pipeline_counts
from fedqueue.llm.pipelines.submission import PipelineSubmission
from fedqueue.llm.pipelines.submit import PipelineRequest, SubmittedPipeline
from fedqueue.llm.pipelines.summary import pipeline_summary, summary_line
from fedqueue.llm.settings import GenerationSettings
from fedqueue.llm.submission import model_name
from fedqueue.store import Store

ITEMS_FAILED = 3  # the exit code of a pipeline that finished with failed items (as `llm submit`'s failed prompts)
_DEFAULT = GenerationSettings()


@friendly_errors
def pipeline(
    input_path: Annotated[Path, typer.Argument(metavar="ITEMS", help="Items: a JSONL file, one JSON value a line.")],
    program: Annotated[str, typer.Option(help="The program, by import path: mypkg.module:function.")],
    model: Annotated[str, typer.Option(help="Model folder, cached hub id or .gguf file (read from local files).")],
    max_steps: Annotated[int, typer.Option(help="Most calls one item may make.")] = DEFAULT_MAX_STEPS,
    max_new_tokens: Annotated[int, typer.Option(help="Most tokens per call (a request may set its own).")] = (
        _DEFAULT.max_new_tokens
    ),
    temperature: Annotated[float, typer.Option(help="0 decodes greedily; above 0 samples.")] = _DEFAULT.temperature,
    top_p: Annotated[float, typer.Option(help="Nucleus sampling mass (with --temperature above 0).")] = _DEFAULT.top_p,
    seed: Annotated[int, typer.Option(help="Sampling seed; each item and step draws from its own.")] = _DEFAULT.seed,
    dtype: Annotated[str, typer.Option(help="auto, float32, bfloat16 or float16.")] = _DEFAULT.dtype,
    backend: Annotated[str, typer.Option(help="transformers (or vllm where installed).")] = _DEFAULT.backend,
    batch_size: Annotated[int, typer.Option(help="Most calls per batch.")] = DEFAULT_BATCH_SIZE,
    job: Annotated[str | None, typer.Option(help="Name the pipeline (default: derived from its inputs).")] = None,
    detach: Annotated[bool, typer.Option(help="Print the pipeline's id and return.")] = False,
    out: Annotated[
        Path | None, typer.Option("--out", "-o", help="Export the items to this JSONL file when the pipeline ends.")
    ] = None,
    procs: ProcsOpt = None,
    slots: SlotsOpt = DEFAULT_WORKER_SLOTS,
    gpus_per_worker: GpusPerWorkerOpt = DEFAULT_GPUS_PER_WORKER,
    plugin_path: PluginPathOpt = None,
) -> None:
    """Run a program over every item: each call it yields is batched with other items' calls on the workers.

    Exit codes: 0 every item done; 3 the pipeline finished and some items failed (their tracebacks are in
    the export); 2 the items, program, model or options are at fault, nothing stored; 1 the pipeline could
    not run to its end.
    """
    generation = GenerationSettings(
        max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, seed=seed, dtype=dtype, backend=backend
    )
    request = PipelineRequest(
        input_path=input_path,
        program=program,
        model=model_name(model),
        generation=generation,
        max_steps=max_steps,
        batch_size=batch_size,
        job=job,
    )
    if out is not None:
        check_out_folder(out, "--out")
    settings = Settings.from_env().with_plugin_path(plugin_path)
    settings.activate_plugin_path()
    if detach:
        settings = with_local_broker(settings)
        if not settings.broker_url:
            raise ConfigError("--detach: needs FEDQUEUE_BROKER_URL, or a local cluster up (fedqueue up -d)")
        if out is not None:
            raise ConfigError("--out: the pipeline is not followed with --detach; use `fedqueue llm export` later")
    submission = PipelineSubmission(request, _announce, _warn, _option)
    submission.check_before_start(settings)
    if detach:
        print(submit_detached(submission, settings))
        return
    handle = submit_and_follow(
        submission, settings, procs=procs, slots=slots, gpus_per_worker=gpus_per_worker, wait_for_workers=True
    )
    if out is not None:
        export_pipeline(handle.store, handle.id, out)
    exit_unless_finished(handle)
    failed = pipeline_counts(handle.store, handle.id).get("failed", 0)
    if failed:
        error_console.print(
            f"{failed} items failed (exit {ITEMS_FAILED}); each with its traceback: fedqueue llm export {handle.id} -o FILE",
            highlight=False,
        )
        raise typer.Exit(ITEMS_FAILED)


def show_pipeline(store: Store, run_id: str, as_json: bool) -> None:
    summary = pipeline_summary(store, run_id)
    if as_json:
        print(json.dumps(summary, indent=2))
        return
    console.print(summary_line(summary), highlight=False)
    for error in summary["errors"]:
        name = f"id {error['id']!r}" if error["id"] is not None else f"line {error['line']}"
        console.print(f"[yellow]{name} failed:[/yellow] {error['error']}", highlight=False)


def export_pipeline(store: Store, run_id: str, out: Path) -> None:
    rows = write_pipeline_export(store, run_id, out, "--out")
    running = sum(1 for row in rows if row["state"] == "running")
    note = f" ({running} still running)" if running else ""
    error_console.print(f"{len(rows)} items written to {out}{note}", highlight=False)


def _announce(submitted: SubmittedPipeline) -> None:
    what = "continued" if submitted.resumed else "submitted"
    console.print(
        f"pipeline [bold]{submitted.job_id}[/bold] {what}: {submitted.items} items, {submitted.running} to run "
        f"on {submitted.lanes} lanes",
        highlight=False,
    )


def _warn(message: str) -> None:
    error_console.print(f"warning: {message}", highlight=False)


def _option(field: str) -> str:
    return "--" + field.replace("_", "-")
