"""LLM batch jobs' Python API: `fedqueue.llm.run(prompts, model=...)` and friends, over the kind-neutral fedqueue.api.

import fedqueue.llm
handle = fedqueue.llm.run(["Hello", {"id": "q2", "prompt": "Name a colour."}], model="./my-model", max_new_tokens=32)
print([row["output"] for row in handle.rows()])
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fedqueue.api import Placement, check, local_cluster, runs, with_plugins
from fedqueue.api import RunHandle as AnyRunHandle
from fedqueue.api import run as run_job
from fedqueue.api import submit as submit_job
from fedqueue.config import DEFAULT_GPUS_PER_WORKER, DEFAULT_WORKER_SLOTS, Settings
from fedqueue.errors import ConfigError
from fedqueue.llm.export import check_out_folder, export_rows, write_export
from fedqueue.llm.job import DEFAULT_BATCH_SIZE, JOB_ID, JobRequest, Submitted, require_job
from fedqueue.llm.prompts import prompts_as_jsonl
from fedqueue.llm.results import job_counts
from fedqueue.llm.settings import GenerationSettings
from fedqueue.llm.submission import model_name, prepare
from fedqueue.llm.summary import job_summary
from fedqueue.llm.wake import stored_waiter

if TYPE_CHECKING:
    from fedqueue.core.services import WorkerSlots

__all__ = [
    "JOB_OPTIONS",
    "GenerationSettings",
    "JobHandle",
    "PromptsLike",
    "get_job",
    "job_request",
    "local_cluster",
    "run",
    "runs",
    "submit",
]

# A path to a JSONL or .txt file, or the prompts themselves: strings, or dicts of a JSONL line's fields.
PromptsLike = str | os.PathLike[str] | Iterable[str | Mapping[str, Any]]
# Options besides the generation settings (GenerationSettings' fields), as `fedqueue llm submit` takes them.
JOB_OPTIONS = ("batch_size", "max_batch_tokens", "job", "strict", "chat")
PYTHON_INPUT = Path("<prompts>")  # how prompts given in Python are named: in errors, and as the job's input
PROGRESS_KEYS = ("done", "failed", "pending", "total", "prompt_tokens", "generated_tokens")


class JobHandle(AnyRunHandle):
    """One LLM batch job: its status, its progress and its rows, read back from the store."""

    def __init__(self, run_id: str, settings: Settings, submitted: Submitted | None = None) -> None:
        super().__init__(run_id, settings)
        # What submitting did (prompts, bad lines, batches), where this handle's process submitted the job.
        self.submitted = submitted

    def status(self) -> dict[str, Any]:
        """What `fedqueue llm status --json` prints: prompts by state, tokens, speed per worker, the first errors."""
        return job_summary(self.store, self.id)

    def progress(self) -> dict[str, int]:
        """Prompts done, failed, pending and in all, and tokens so far (cheaper than `status`)."""
        counts = job_counts(self.store, self.id)
        return {key: counts.get(key, 0) for key in PROGRESS_KEYS}

    def follow(self, timeout_s: float | None = None, poll_s: float = 0.5) -> Iterator[dict[str, int]]:
        """The job's progress each time it changes, until the job ends (its final progress last)."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        last: dict[str, int] | None = None
        while True:
            running = self.state == "running"  # read before the counts, so the last counts are the final ones
            now = self.progress()
            if now != last:
                yield now
                last = now
            if not running:
                return
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"job {self.id} still running after {timeout_s} s")
            time.sleep(poll_s)

    def rows(self) -> list[dict[str, Any]]:
        """One dict per input line, in input order: id, line, state, output, tokens, finish_reason, error."""
        return export_rows(self.store, self.id)

    def export(self, out: str | os.PathLike[str]) -> Path:
        """Write `rows()` as JSON lines to `out` (replaced whole, never half-written)."""
        path = Path(out)
        write_export(self.store, self.id, path)
        return path


def job_request(prompts: PromptsLike, model: str | os.PathLike[str], **options: Any) -> JobRequest:
    """A checked request: `options` are GenerationSettings' fields (max_new_tokens, temperature, top_p,
    seed, dtype, backend) and batch_size, max_batch_tokens, job (a name), strict and chat (plain prompts sent
    as a chat of one user message)."""
    if not isinstance(model, str | os.PathLike) or not os.fspath(model).strip():
        raise ConfigError("model: expected a model folder, cached hub id or .gguf file, as a non-empty string")
    known = {field.name for field in fields(GenerationSettings)} | set(JOB_OPTIONS)
    unknown = sorted(set(options) - known)
    if unknown:
        raise ConfigError(f"{unknown[0]}: unknown option (known: {', '.join(sorted(known))})")
    generation = GenerationSettings(**{name: value for name, value in options.items() if name not in JOB_OPTIONS})
    batch_size = options.get("batch_size", DEFAULT_BATCH_SIZE)
    max_batch_tokens = options.get("max_batch_tokens")
    for name, value in (("batch_size", batch_size), ("max_batch_tokens", max_batch_tokens)):
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            raise ConfigError(f"{name}: must be an integer of at least 1, or None")
    if batch_size is None and max_batch_tokens is None:
        raise ConfigError("batch_size or max_batch_tokens: give at least one")
    job_name = options.get("job")
    if job_name is not None and (not isinstance(job_name, str) or not JOB_ID.fullmatch(job_name)):
        raise ConfigError("job: 1 to 32 letters, digits, '_', '.' or '-', starting with a letter or digit")
    strict, chat = options.get("strict", False), options.get("chat", False)
    for name, flag in (("strict", strict), ("chat", chat)):
        if not isinstance(flag, bool):
            raise ConfigError(f"{name}: must be True or False")
    if isinstance(prompts, str | os.PathLike):
        input_path, data = Path(prompts), None
    else:
        input_path, data = PYTHON_INPUT, prompts_as_jsonl(prompts)
    return JobRequest(
        input_path=input_path,
        model=model_name(os.fspath(model)),
        generation=generation,
        batch_size=batch_size,
        max_batch_tokens=max_batch_tokens,
        job=job_name,
        strict=strict,
        chat=chat,
        input_data=data,
    )


def submit(
    prompts: PromptsLike,
    model: str | os.PathLike[str],
    *,
    settings: Settings | None = None,
    plugin_path: list[str] | None = None,
    worker_slots: WorkerSlots | None = None,
    **options: Any,
) -> JobHandle:
    """Check, enqueue the job's batches on the configured broker and return at once.

    Batches are planned for `worker_slots` (the workers' slots by hostname, where the caller started
    them), else for the slots of the workers answering on the broker. The same prompts, model and
    settings again continue the job: only prompts not yet stored are generated.
    """
    request = job_request(prompts, model, **options)
    settings = with_plugins(settings, plugin_path)
    if not settings.broker_url:  # before anything is written
        raise ConfigError(
            "FEDQUEUE_BROKER_URL: not set (use fedqueue.llm.run(), or submit inside fedqueue.local_cluster())"
        )
    submission = prepare(request, settings, ask_slots=worker_slots is None)
    check(submission, settings)
    handle = submit_job(submission, Placement(settings, worker_slots))
    return JobHandle(handle.id, settings, submission.submitted)


def run(
    prompts: PromptsLike,
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
) -> JobHandle:
    """Submit and wait, scheduling the job meanwhile (batches lost with a worker are sent again); with
    `out`, export its rows there at the end. With no broker configured: on the cluster `fedqueue up`
    left running for these settings, else on local workers started here and stopped afterwards."""
    request = job_request(prompts, model, **options)
    settings = with_plugins(settings, plugin_path)
    if out is not None:
        check_out_folder(Path(out))
    submission = prepare(request, settings, ask_slots=bool(settings.broker_url))
    handle = run_job(
        submission,
        settings,
        procs=procs,
        slots=slots,
        gpus_per_worker=gpus_per_worker,
        wait_for_workers=True,  # as `fedqueue llm submit` does
        timeout_s=timeout_s,
        pause=stored_waiter,  # the follower sees the end as soon as the last batch is stored
    )
    done = JobHandle(handle.id, handle.settings, submission.submitted)
    if out is not None:
        done.export(out)
    return done


def get_job(job_id: str, settings: Settings | None = None) -> JobHandle:
    """A handle on an LLM job submitted before (by any process), from the store of these settings."""
    handle = JobHandle(job_id, settings or Settings.from_env())
    require_job(handle.store, job_id)  # NotFound, or a ConfigError for a run of another kind
    return handle
