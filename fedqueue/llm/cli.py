"""`fedqueue llm ...`: submit a batch job of prompts, follow it, read its status, export its outputs.

The commands over what the Python API (fedqueue.llm.api) submits through: llm/submission.py, llm/export.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from fedqueue.cli.common import (
    GpusPerWorkerOpt,
    JsonOpt,
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
from fedqueue.core.database import open_store
from fedqueue.errors import ConfigError
from fedqueue.llm.export import check_out_folder, write_export
from fedqueue.llm.job import DEFAULT_BATCH_SIZE, JobRequest, Submitted, require_job
from fedqueue.llm.pipelines.cli import export_pipeline, pipeline, show_pipeline
from fedqueue.llm.pipelines.config import is_pipeline
from fedqueue.llm.results import job_counts
from fedqueue.llm.settings import GenerationSettings
from fedqueue.llm.submission import model_name, prepare
from fedqueue.llm.summary import job_summary
from fedqueue.store import Store

app = typer.Typer(
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="LLM batch jobs: a file of prompts generated in batches by the workers, outputs kept in the store.",
)

app.command()(pipeline)

SOME_FAILED = 3  # `llm submit`'s exit code for a job that finished with failed prompts
JobArg = Annotated[str, typer.Argument(help="Job id (printed by `fedqueue llm submit`).")]
_DEFAULT = GenerationSettings()  # the generation options' defaults


@app.command()
@friendly_errors
def submit(
    input_path: Annotated[
        Path, typer.Argument(metavar="INPUT", help="Prompts: JSONL ({prompt} or {messages}, optional id) or .txt.")
    ],
    model: Annotated[str, typer.Option(help="Model folder, cached hub id or .gguf file (read from local files).")],
    max_new_tokens: Annotated[int, typer.Option(help="Most tokens generated per prompt.")] = _DEFAULT.max_new_tokens,
    temperature: Annotated[float, typer.Option(help="0 decodes greedily; above 0 samples.")] = _DEFAULT.temperature,
    top_p: Annotated[float, typer.Option(help="Nucleus sampling mass (with --temperature above 0).")] = _DEFAULT.top_p,
    seed: Annotated[int, typer.Option(help="Sampling seed; each prompt draws from its own generator.")] = _DEFAULT.seed,
    dtype: Annotated[str, typer.Option(help="auto, float32, bfloat16 or float16.")] = _DEFAULT.dtype,
    backend: Annotated[str, typer.Option(help="transformers (or vllm where installed).")] = _DEFAULT.backend,
    batch_size: Annotated[int, typer.Option(help="Most prompts per batch.")] = DEFAULT_BATCH_SIZE,
    max_batch_tokens: Annotated[
        int | None, typer.Option(help="Most tokens per batch: prompts x (longest prompt + max new tokens).")
    ] = None,
    job: Annotated[
        str | None, typer.Option(help="Name the job (default: derived from input, model, settings).")
    ] = None,
    strict: Annotated[
        bool, typer.Option(help="Refuse the whole input if any line is bad or too long for the model.")
    ] = False,
    chat: Annotated[
        bool, typer.Option(help="Send each plain prompt as a chat of one user message (for chat models).")
    ] = False,
    detach: Annotated[
        bool, typer.Option(help="Print the job id and return (on FEDQUEUE_BROKER_URL, or `fedqueue up`'s cluster).")
    ] = False,
    out: Annotated[
        Path | None, typer.Option("--out", "-o", help="Export the outputs to this JSONL file when the job ends.")
    ] = None,
    procs: ProcsOpt = None,
    slots: SlotsOpt = DEFAULT_WORKER_SLOTS,
    gpus_per_worker: GpusPerWorkerOpt = DEFAULT_GPUS_PER_WORKER,
    plugin_path: PluginPathOpt = None,
) -> None:
    """Submit a job and follow it to the end. Submitting the same input and model again generates only what is missing.

    With no broker configured, the cluster `fedqueue up` left, else an embedded Redis and local workers
    run it here. Batches are sized for the worker slots that will run them: those workers', or those
    answering on the broker.

    Exit codes: 0 every prompt done; 3 the job finished and some prompts (or input lines) failed; 2 the
    input, model or options are at fault, nothing stored; 1 the job could not run to its end.
    """
    generation = GenerationSettings(
        max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, seed=seed, dtype=dtype, backend=backend
    )
    request = JobRequest(
        input_path=input_path,
        model=model_name(model),
        generation=generation,
        batch_size=batch_size,
        max_batch_tokens=max_batch_tokens,
        job=job,
        strict=strict,
        chat=chat,
    )
    if out is not None:
        check_out_folder(out, "--out")
    settings = Settings.from_env().with_plugin_path(plugin_path)
    if detach:  # the configured broker, else that of a cluster `fedqueue up` runs for these settings
        settings = with_local_broker(settings)
    if detach and not settings.broker_url:
        raise ConfigError("--detach: needs FEDQUEUE_BROKER_URL, or a local cluster up (fedqueue up -d)")
    if detach and out is not None:
        raise ConfigError("--out: the job is not followed with --detach; use `fedqueue llm export` later")
    # The input, vLLM and the model (where the workers start here); a bad database before any worker starts.
    submission = prepare(request, settings, ask_slots=bool(settings.broker_url), warn=_warn, option=_option)
    submission.announce = _announce
    if detach:
        print(submit_detached(submission, settings))
        return
    handle = submit_and_follow(
        submission, settings, procs=procs, slots=slots, gpus_per_worker=gpus_per_worker, wait_for_workers=True
    )
    if out is not None:
        export_job(handle.store, handle.id, out)
    exit_unless_finished(handle)
    exit_if_prompts_failed(handle.store, handle.id)


def exit_if_prompts_failed(store: Store, job_id: str) -> None:
    """A finished job with failed rows exits SOME_FAILED, saying how many: a script sees that outputs are missing."""
    counts = job_counts(store, job_id)
    failed = counts.get("failed", 0)
    if failed:
        error_console.print(
            f"{failed} of {counts.get('total', 0)} prompts failed (exit {SOME_FAILED}); "
            f"each with its error: fedqueue llm export {job_id} -o FILE",
            highlight=False,
        )
        raise typer.Exit(SOME_FAILED)


def _warn(message: str) -> None:
    error_console.print(f"warning: {message}", highlight=False)


def _option(field: str) -> str:
    """A request field as its option is spelled here: max_batch_tokens is --max-batch-tokens."""
    return "--" + field.replace("_", "-")


def _announce(submitted: Submitted) -> None:
    what = "continued" if submitted.resumed else "submitted"
    console.print(
        f"job [bold]{submitted.job_id}[/bold] {what}: {submitted.prompts} prompts, "
        f"{submitted.enqueued} to generate in {len(submitted.batches)} batches for {submitted.slots} worker slots",
        highlight=False,
    )
    for error in submitted.input_errors[:5]:
        error_console.print(f"[yellow]skipped[/yellow] {error}", highlight=False)
    if len(submitted.input_errors) > 5:
        error_console.print(f"... {len(submitted.input_errors) - 5} more bad lines (stored as failed rows)")


def print_job(out: Console, summary: dict[str, Any]) -> None:
    rate = summary["tokens_per_s"]
    pad = summary["pad_fraction"]
    out.print(
        f"job {summary['id']} ({summary['state']}): {summary['done']} done, {summary['failed']} failed, "
        f"{summary['pending']} pending of {summary['prompts']} prompts · {summary['generated_tokens']} tokens "
        f"generated in {summary['wall_s']:.1f} s"
        + ("" if rate is None else f" ({rate:,.0f} tokens/s)")
        + ("" if pad is None else f" · padding {100 * pad:.0f} %"),
        highlight=False,
    )
    for worker in summary["workers"]:
        rate_text = "" if worker["tokens_per_s"] is None else f", {worker['tokens_per_s']:,.0f} tokens/s"
        out.print(f"  {worker['worker']}: busy {worker['busy_s']:.1f} s{rate_text}", highlight=False)
    for error in summary["errors"]:
        name = f"id {error['id']!r}" if error["id"] is not None else f"line {error['line']}"
        out.print(f"[yellow]{name} failed:[/yellow] {error['error']}", highlight=False)
    if summary["failed"] > len(summary["errors"]):
        out.print(f"... {summary['failed'] - len(summary['errors'])} more failed (fedqueue llm export)")


def show_status(store: Store, job_id: str, as_json: bool) -> None:
    """What `fedqueue status` prints for an LLM job or pipeline."""
    if is_pipeline(store.get_run(job_id).config):
        show_pipeline(store, job_id, as_json)
        return
    summary = job_summary(store, job_id)
    if as_json:
        print(json.dumps(summary, indent=2))
    else:
        print_job(console, summary)


@app.command()
@friendly_errors
def status(job: JobArg, json_: JsonOpt = False) -> None:
    """Prompts done, failed and pending, tokens per second per worker, padding, the first errors."""
    store = open_store(Settings.from_env().database_url)
    try:
        require_job(store, job)
        show_status(store, job, json_)
    finally:
        store.close()


@app.command()
@friendly_errors
def export(
    job: JobArg,
    out: Annotated[Path, typer.Option("--out", "-o", help="JSONL file to write (replaced whole, never half-written).")],
) -> None:
    """Write one JSON line per input line, in input order: id, line, state, output, tokens, finish reason, error."""
    store = open_store(Settings.from_env().database_url)
    try:
        require_job(store, job)
        export_job(store, job, out)
    finally:
        store.close()


def export_job(store: Store, job: str, out: Path) -> None:
    """The job's rows (a pipeline's items) as JSON lines in input order, written whole to `out`."""
    if is_pipeline(store.get_run(job).config):
        export_pipeline(store, job, out)
        return
    rows = write_export(store, job, out, "--out")
    pending = sum(1 for row in rows if row["state"] == "pending")
    note = f" ({pending} still pending)" if pending else ""
    error_console.print(f"{len(rows)} lines written to {out}{note}", highlight=False)
