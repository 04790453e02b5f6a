"""Submitting an LLM batch job: read the input, record a row per prompt, plan batches, enqueue them.

Submitting the same input and model again continues the job: its id is derived from both, rows
already there are kept, and only prompts still pending are planned and enqueued. No torch here.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedqueue.core.runs.cancel import CANCELLED
from fedqueue.core.services import Services
from fedqueue.core.waits.outage import run_stored
from fedqueue.errors import ConfigError, NotFound
from fedqueue.llm.backends import registry as backends
from fedqueue.llm.backends.base import LlmBackend
from fedqueue.llm.context import TooLong, too_long
from fedqueue.llm.messages import KEY_MAX, KIND_NAME, GenerateBatch
from fedqueue.llm.model_files import model_facts
from fedqueue.llm.planner import (
    DEFAULT_SLOTS,
    MAX_PAD_FRACTION,
    PlannedBatch,
    approximate_tokens,
    check_limits,
    deduplicate,
    plan_batches,
    token_counter,
)
from fedqueue.llm.prompts import ERRORS_SHOWN, InputError, PromptLine, read_input, read_prompt_bytes
from fedqueue.llm.results import (
    assign_batches,
    insert_prompts,
    job_counts,
    next_batch_index,
    pending_prompts,
    settle_copies,
)
from fedqueue.llm.schema import LlmPromptRow
from fedqueue.llm.settings import GenerationSettings
from fedqueue.store import Store

DEFAULT_BATCH_SIZE = 32  # `--batch-size`: most prompts per batch
JOB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,31}")


@dataclass(frozen=True)
class JobRequest:
    """What `fedqueue llm submit` (or fedqueue.llm.submit) asks for."""

    input_path: Path
    model: str
    generation: GenerationSettings = field(default_factory=GenerationSettings)
    batch_size: int | None = DEFAULT_BATCH_SIZE
    max_batch_tokens: int | None = None
    job: str | None = None  # a name of the user's choosing; derived from the input and model when None
    strict: bool = False
    chat: bool = False  # plain prompts are sent as a chat of one user message
    # Worker slots the batches are sized for (DEFAULT_SLOTS when None). Not part of the job's identity:
    # the same job continued on more or fewer workers is planned for those.
    slots: int | None = None
    # The input's bytes where the prompts were given in Python; `input_path` then only names them.
    input_data: bytes | None = None

    @property
    def planned_slots(self) -> int:
        return DEFAULT_SLOTS if self.slots is None else self.slots

    def read_input(self) -> bytes:
        return read_input(self.input_path) if self.input_data is None else self.input_data

    def read_prompts(self, raw: bytes) -> tuple[list[PromptLine], list[InputError]]:
        return read_prompt_bytes(raw, self.input_path, strict=self.strict, chat=self.chat)

    @property
    def backend(self) -> LlmBackend:
        """The backend its generation names (a ConfigError for one not installed)."""
        return backends.get(self.generation.backend)

    def too_long(self, prompts: Sequence[PromptLine]) -> list[TooLong]:
        """Prompts the model's own tokenizer, read here, finds too long for its context."""
        generation = self.generation
        return too_long(prompts, model_facts(self.model), generation.max_new_tokens, self.backend)

    def config(self, input_sha256: str) -> dict[str, Any]:
        """The run row's config: what decides the outputs, and the input it came from."""
        config: dict[str, Any] = {
            "model": self.model,
            "generation": self.generation.to_dict(),
            "batch_size": self.batch_size,
            "max_batch_tokens": self.max_batch_tokens,
            "input": self.input_path.name,
            "input_sha256": input_sha256,
        }
        if self.chat:  # only then: the ids of jobs submitted without it stay as they were
            config["chat"] = True
        return config


@dataclass(frozen=True)
class Submitted:
    job_id: str
    resumed: bool  # the job was there already: only its pending prompts were enqueued
    prompts: int  # valid input lines
    input_errors: list[InputError]
    batches: list[PlannedBatch]
    slots: int = DEFAULT_SLOTS  # worker slots the batches were sized for

    @property
    def enqueued(self) -> int:
        return sum(len(batch.keys) for batch in self.batches)


def job_id_for(request: JobRequest, input_sha256: str) -> str:
    if request.job is not None:
        if not JOB_ID.fullmatch(request.job):
            raise ConfigError("--job: 1 to 32 letters, digits, '_', '.' or '-', starting with a letter or digit")
        return request.job
    decided_by = {key: value for key, value in request.config(input_sha256).items() if key != "input"}
    return "llm-" + hashlib.sha256(json.dumps(decided_by, sort_keys=True).encode()).hexdigest()[:12]


def check_request(request: JobRequest) -> list[PromptLine]:
    """Everything about a request that can be wrong, checked before anything is started or written; the
    valid prompts. With `strict`, a prompt too long for the model refuses the whole input, naming its line."""
    check_limits(request.batch_size, request.max_batch_tokens, request.planned_slots)
    backends.get(request.generation.backend)  # one not installed is refused before the input is read
    job_id_for(request, "")
    prompts, _ = request.read_prompts(request.read_input())
    if request.strict:
        found = request.too_long(prompts)
        if found:
            shown = "; ".join(f"line {item.prompt.line}: {item.message}" for item in found[:ERRORS_SHOWN])
            more = f" (and {len(found) - ERRORS_SHOWN} more)" if len(found) > ERRORS_SHOWN else ""
            what = "a prompt" if len(found) == 1 else f"{len(found)} prompts"
            raise ConfigError(f"input {request.input_path}: {what} too long for the model: {shown}{more}")
    return prompts


def submit_job(services: Services, request: JobRequest) -> Submitted:
    """Record the job (or find it), add its prompts, plan and enqueue whatever is pending."""
    check_limits(request.batch_size, request.max_batch_tokens, request.planned_slots)
    raw = request.read_input()
    prompts, input_errors = request.read_prompts(raw)
    # Too long for the model: a failed row each, in its place, instead of a batch that fails on a worker.
    refused = request.too_long(prompts)
    if refused:
        lines = {item.prompt.line for item in refused}
        prompts = [prompt for prompt in prompts if prompt.line not in lines]
    input_sha256 = hashlib.sha256(raw).hexdigest()
    job_id = job_id_for(request, input_sha256)
    config = request.config(input_sha256)
    resumed = _open_job(services, job_id, config)
    with run_stored(job_id):  # the broker failing from here leaves the job for its repair pass to enqueue
        _, copies = deduplicate(prompts)
        rows = [
            *_prompt_rows(job_id, prompts, copies),
            *_error_rows(job_id, input_errors),
            *_too_long_rows(job_id, refused),
        ]
        insert_prompts(services.store, rows)
        input_errors = sorted(
            [*input_errors, *(InputError(item.prompt.line, item.prompt.input_id, item.message) for item in refused)],
            key=lambda error: error.line,
        )
        settle_copies(services.store, job_id)
        if job_counts(services.store, job_id).get("pending", 0) == 0:
            services.store.finish_run(job_id, "finished")  # nothing left to generate (a finished job is left as it is)
            return Submitted(job_id, resumed, len(prompts), input_errors, [], request.planned_slots)
        services.store.reopen_run(job_id)
        batches = plan_pending(services, job_id, request)
        return Submitted(job_id, resumed, len(prompts), input_errors, batches, request.planned_slots)


def plan_pending(services: Services, job_id: str, request: JobRequest) -> list[PlannedBatch]:
    """Cut the job's pending prompts into batches, numbered after any earlier plan, and enqueue them."""
    pending = [_prompt_line(row) for row in pending_prompts(services.store, job_id)]
    if not pending:
        return []
    count = _counter(request.model)
    lengths = [(prompt.key, count(prompt)) for prompt in pending]
    planned = plan_batches(
        lengths,
        batch_size=request.batch_size,
        max_batch_tokens=request.max_batch_tokens,
        max_new_tokens=request.generation.max_new_tokens,
        slots=request.planned_slots,
        # A backend that pads nothing (vLLM's paged attention) has its batches cut by size and slots alone.
        max_pad_fraction=MAX_PAD_FRACTION if request.backend.pads_batches else 1.0,
    )
    first = next_batch_index(services.store, job_id)
    batches = [PlannedBatch(first + batch.index, batch.keys, batch.tokens) for batch in planned]
    assign_batches(services.store, job_id, [(batch.index, batch.keys) for batch in batches])
    now = time.time()
    services.enqueue([GenerateBatch(job_id, batch.index, batch.keys, now) for batch in batches])
    return batches


def require_job(store: Store, job_id: str) -> None:
    """A ConfigError unless `job_id` is an LLM job (NotFound when it is no run at all)."""
    run = store.get_run(job_id)
    if run.kind != KIND_NAME:
        raise ConfigError(f"{job_id}: a run of kind {run.kind!r}, not an LLM job (fedqueue status {job_id})")


def _open_job(services: Services, job_id: str, config: dict[str, Any]) -> bool:
    """Create the job's run row, or check that the one there is this job; True when it was there."""
    try:
        run = services.store.get_run(job_id)
    except NotFound:
        name = config["input"][:200]
        services.store.create_run(job_id, name, config, 0, kind=KIND_NAME, broker_id=services.ledger.broker_id())
        return False
    if run.kind != KIND_NAME:
        raise ConfigError(f"--job {job_id}: that id belongs to a run of kind {run.kind!r}; choose another")
    if run.state == CANCELLED:  # cancelled is final: never reopened
        raise ConfigError(f"job {job_id} was cancelled; use another --job to run it again")
    for setting in ("model", "generation", "chat"):
        if run.config.get(setting) != config.get(setting):
            raise ConfigError(
                f"job {job_id}: submitted before with another {setting} ({json.dumps(run.config.get(setting))}); "
                "use another --job to run these settings"
            )
    return True


def _prompt_rows(job_id: str, prompts: Sequence[PromptLine], copies: dict[str, str]) -> list[dict[str, Any]]:
    return [
        {
            "run_id": job_id,
            "key": prompt.key[:KEY_MAX],
            "input_id": prompt.input_id,
            "line": prompt.line,
            "prompt_sha256": prompt.sha256,
            "prompt": prompt.prompt,
            "messages": None if prompt.messages is None else [list(pair) for pair in prompt.messages],
            "same_as": copies.get(prompt.key),
            "state": "pending",
        }
        for prompt in prompts
    ]


def _error_rows(job_id: str, input_errors: Sequence[InputError]) -> list[dict[str, Any]]:
    """A row per bad input line, so the export shows it in its place with its error."""
    return [
        {
            "run_id": job_id,
            "key": f"error:line:{error.line}",
            "input_id": error.input_id,
            "line": error.line,
            "prompt_sha256": "",
            "state": "failed",
            "error": error.message,
        }
        for error in input_errors
    ]


def _too_long_rows(job_id: str, refused: Sequence[TooLong]) -> list[dict[str, Any]]:
    """A failed row per prompt too long for the model, under its own key (its id or line), with its text."""
    rows = _prompt_rows(job_id, [item.prompt for item in refused], {})
    for row, item in zip(rows, refused, strict=True):
        row.update(state="failed", error=item.message, prompt_tokens=item.tokens, generated_tokens=0)
    return rows


def _prompt_line(row: LlmPromptRow) -> PromptLine:
    messages = None if row.messages is None else tuple((str(role), str(text)) for role, text in row.messages)
    return PromptLine(key=row.key, input_id=row.input_id, line=row.line, prompt=row.prompt, messages=messages)


def _counter(model: str) -> Any:
    """Token counts for planning: the model's own tokenizer where it has a tokenizer.json, else an estimate."""
    folder = Path(model)
    found = token_counter(folder) if folder.is_dir() else None
    return found or approximate_tokens
