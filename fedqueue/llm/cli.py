"""`fedqueue llm ...`: submit a batch job of prompts, follow it, read its status, export its outputs."""

from __future__ import annotations

import importlib.util
import json
import os
import tempfile
from concurrent.futures import Future
from dataclasses import dataclass, replace
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
from fedqueue.config import DEFAULT_GPUS_PER_WORKER, DEFAULT_WORKER_SLOTS, Settings
from fedqueue.core.database import open_store
from fedqueue.core.services import Services
from fedqueue.errors import ConfigError
from fedqueue.llm.job import DEFAULT_BATCH_SIZE, JobRequest, Submitted, check_request, submit_job
from fedqueue.llm.results import prompt_rows
from fedqueue.llm.settings import GenerationSettings
from fedqueue.llm.summary import job_summary
from fedqueue.store import Store

app = typer.Typer(
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="LLM batch jobs: a file of prompts generated in batches by the workers, outputs kept in the store.",
)

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
    strict: Annotated[bool, typer.Option(help="Refuse the whole input if any line is bad.")] = False,
    detach: Annotated[bool, typer.Option(help="Print the job id and return (needs FEDQUEUE_BROKER_URL).")] = False,
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
    """
    generation = GenerationSettings(
        max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, seed=seed, dtype=dtype, backend=backend
    )
    request = JobRequest(
        input_path=input_path,
        model=_model_name(model),
        generation=generation,
        batch_size=batch_size,
        max_batch_tokens=max_batch_tokens,
        job=job,
        strict=strict,
    )
    check_request(request)  # a bad input line (--strict), limit or job name: refused before anything is written
    if out is not None:
        _check_out_folder(out)
    settings = Settings.from_env().with_plugin_path(plugin_path)
    if detach and not settings.broker_url:
        raise ConfigError("--detach: needs FEDQUEUE_BROKER_URL (start `fedqueue up` and export the URL it prints)")
    if detach and out is not None:
        raise ConfigError("--out: the job is not followed with --detach; use `fedqueue llm export` later")
    # vLLM and the model where the workers start here; a bad database before any worker starts.
    _check_backend(backend, workers_here=not settings.broker_url)
    submission = JobSubmission(request)
    if settings.broker_url:
        from fedqueue.llm.slots import answering_slots_later

        submission.answering = answering_slots_later(settings)  # the workers answer while this process connects
        _check_model_here(request.model, must_exist=False)
    else:
        _check_model_here(request.model, must_exist=True)
        open_store(settings.database_url, migrate=True).close()
    if detach:
        print(submit_detached(submission, settings))
        return
    handle = submit_and_follow(
        submission, settings, procs=procs, slots=slots, gpus_per_worker=gpus_per_worker, wait_for_workers=True
    )
    if out is not None:
        export_job(handle.store, handle.id, out)
    exit_unless_finished(handle)


@dataclass
class JobSubmission:
    """An LLM batch job to submit: its batches are planned for the worker slots that will run them."""

    request: JobRequest
    # The slots of the workers answering on a configured broker, asked while the rest is checked;
    # None where the workers were started here or by `fedqueue up`.
    answering: Future[int | None] | None = None

    def check(self, settings: Settings) -> None:
        """The input, the model and the backend were checked before any worker started."""

    def submit(self, services: Services) -> str:
        if self.answering is not None:
            slots = _answered(self.answering)
        else:  # workers started here or by `fedqueue up`: their slots are known
            slots = sum(services.worker_slots().values()) or None
        submitted = submit_job(services, replace(self.request, slots=slots))
        _announce(submitted)
        return submitted.job_id


def _answered(answering: Future[int | None]) -> int | None:
    """The slots the workers on the broker offer; None (the default plan) when none answers."""
    try:
        found = answering.result()
    except Exception as error:  # a broker that answers the publisher but not a broadcast: plan by default
        found = None
        error_console.print(f"warning: could not ask the workers for their slots ({error})", highlight=False)
    return found


def _model_name(model: str) -> str:
    """A model on disk is named by its absolute path, so workers started elsewhere find it."""
    path = Path(model).expanduser()
    if path.exists():
        return str(path.resolve())
    return model


def _check_model_here(model: str, must_exist: bool) -> None:
    """Models are read from local files only: say so now rather than fail every batch on the workers.

    Workers elsewhere (a broker is configured) may hold a model this machine lacks: then only a warning.
    """
    if Path(model).exists():
        return
    looks_like_path = model.startswith(("/", ".", "~")) or model.count("/") > 1 or model.endswith(".gguf")
    if looks_like_path:
        problem = "no such file or directory"
    else:
        from huggingface_hub import try_to_load_from_cache

        if isinstance(try_to_load_from_cache(model, "config.json"), str):
            return
        problem = "not in this machine's Hugging Face cache (models are never downloaded)"
    if must_exist:
        raise ConfigError(f"--model {model}: {problem}")
    error_console.print(f"warning: --model {model}: {problem}; the workers must have it", highlight=False)


def _check_backend(backend: str, workers_here: bool) -> None:
    """vLLM runs on the workers: missing here is fatal only when the workers are started here."""
    if backend != "vllm" or importlib.util.find_spec("vllm") is not None:
        return
    if workers_here:
        raise ConfigError(
            "--backend vllm: vllm is not installed here (pip install 'fedqueue[vllm]', or make vllm); "
            "use --backend transformers"
        )
    error_console.print(
        "warning: --backend vllm: vllm is not installed here; the workers must have it", highlight=False
    )


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
    """What `fedqueue status` prints for an LLM job."""
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
        _require_llm_job(store, job)
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
        _require_llm_job(store, job)
        export_job(store, job, out)
    finally:
        store.close()


def export_job(store: Store, job: str, out: Path) -> None:
    """The job's rows as JSON lines in input order, written whole to `out`."""
    rows = prompt_rows(store, job)
    lines = [
        json.dumps(
            {
                "id": row.input_id,
                "line": row.line,
                "state": row.state,
                "output": row.output,
                "prompt_tokens": row.prompt_tokens,
                "generated_tokens": row.generated_tokens,
                "finish_reason": row.finish_reason,
                "error": row.error,
            },
            ensure_ascii=False,
        )
        for row in rows
    ]
    _write_atomically(out, "".join(line + "\n" for line in lines))
    pending = sum(1 for row in rows if row.state == "pending")
    note = f" ({pending} still pending)" if pending else ""
    error_console.print(f"{len(lines)} lines written to {out}{note}", highlight=False)


def _require_llm_job(store: Store, job_id: str) -> None:
    run = store.get_run(job_id)  # NotFound names the id
    if run.kind != "llm":
        raise ConfigError(f"{job_id}: a run of kind {run.kind!r}, not an LLM job (fedqueue status {job_id})")


def _check_out_folder(path: Path) -> Path:
    folder = path.parent if str(path.parent) else Path(".")
    if not folder.is_dir():
        raise ConfigError(f"--out {path}: folder {folder} does not exist")
    return folder


def _write_atomically(path: Path, text: str) -> None:
    """Write beside the target and rename over it: a reader never sees half a file."""
    folder = _check_out_folder(path)
    handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", dir=folder)
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as file:
            file.write(text)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
