"""What a worker does with one LLM batch: load the model once, generate what is pending, store it. No Celery."""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fedqueue.core.services import Services
from fedqueue.core.timing import timing_of
from fedqueue.llm.backends import registry as backends
from fedqueue.llm.backends.base import LlmBackend
from fedqueue.llm.converted import cache_root
from fedqueue.llm.messages import KIND_NAME, GenerateBatch
from fedqueue.llm.results import Outcome, pending_prompts, record_outcomes
from fedqueue.llm.settings import GenerationSettings
from fedqueue.llm.wake import announce_stored
from fedqueue.store.repo import TaskTiming

if TYPE_CHECKING:
    from fedqueue.llm.model import LoadedModel

log = logging.getLogger(__name__)


class ModelCache:
    """Per worker process: each job's settings, and each model loaded once, lazily on its first batch, and kept
    for every later batch and job of it (a GGUF file through the host's model cache: converted once per host).

    Loading happens on the first task, not when the process starts: a worker that only
    trains FL devices never loads a model, and CUDA is first touched in the task's thread.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._jobs: dict[str, dict[str, Any]] = {}
        self._models: dict[tuple[str, str, str], LoadedModel] = {}

    def job(self, services: Services, run_id: str) -> dict[str, Any]:
        with self._lock:
            config = self._jobs.get(run_id)
        if config is None:
            config = services.store.get_run(run_id).config
            with self._lock:
                self._jobs[run_id] = config
        return config

    def model(self, name: str, dtype: str, backend: LlmBackend, cache: Path | None = None) -> LoadedModel:
        # One loader at a time: two threads of one worker must not load the same model twice. Everything a batch
        # imports is imported here, under the lock, so a second slot never imports beside the first one's load.
        with self._lock:
            loaded = self._models.get((name, dtype, backend.name))
            if loaded is None:
                import fedqueue.llm.generate  # noqa: F401

                loaded = backend.load(name, dtype, cache)
                self._models[(name, dtype, backend.name)] = loaded
        return loaded


def run_batch(services: Services, cache: ModelCache, task: GenerateBatch, worker: str, attempt: int) -> None:
    """Generate the batch's prompts that are still pending and store them; finish the job after its last."""
    started_at = time.time()
    clock = time.perf_counter()
    rows = pending_prompts(services.store, task.run_id, task.keys)
    if not rows:
        # Stored by an earlier delivery: a duplicate, or a redelivery after the worker died storing it.
        log.info("job %s batch %d: nothing pending; skipped", task.run_id, task.batch)
        return
    config = cache.job(services, task.run_id)
    settings = GenerationSettings.from_dict(config["generation"])
    backend = backends.get(settings.backend)
    loaded = cache.model(config["model"], settings.dtype, backend, cache_root(services.settings.model_cache))
    load_ms = _elapsed_ms(clock)
    from fedqueue.llm.generate import PromptIn  # loaded by cache.model, under its lock

    clock = time.perf_counter()
    prompts = [
        PromptIn(
            key=row.key,
            prompt=row.prompt,
            messages=None if row.messages is None else tuple((str(role), str(text)) for role, text in row.messages),
        )
        for row in rows
    ]
    generations, _stats = backend.generate(loaded, prompts, settings)
    compute_ms = _elapsed_ms(clock)
    outcomes = [
        Outcome(
            key=generation.key,
            state="failed" if generation.error is not None else "done",
            output=generation.output,
            prompt_tokens=generation.prompt_tokens,
            generated_tokens=generation.generated_tokens,
            finish_reason=generation.finish_reason,
            error=generation.error,
        )
        for generation in generations
    ]
    timing = _timing(task, "done", worker, attempt, str(loaded.device), started_at, load_ms, compute_ms)
    left = record_outcomes(services.store, task.run_id, task.batch, worker, outcomes, timing)
    if left == 0 and services.store.finish_run(task.run_id, "finished"):
        log.info("job %s: every prompt stored; finished", task.run_id)
    announce_stored(services, task.run_id)


def fail_batch(services: Services, task: GenerateBatch, worker: str, attempts: int, error: str) -> None:
    """A batch that failed every attempt: its pending prompts get the error, so the job still ends."""
    pending = pending_prompts(services.store, task.run_id, task.keys)
    # Each prompt's row gets the traceback's last line (what an export reader needs); the timing row keeps it all.
    reason = next((line for line in reversed(error.strip().splitlines()) if line.strip()), error)
    outcomes = [Outcome(key=row.key, state="failed", error=reason) for row in pending]
    timing = replace(_timing(task, "failed", worker, attempts, "-", time.time(), 0.0, 0.0), error=error[-4000:])
    left = record_outcomes(services.store, task.run_id, task.batch, worker, outcomes, timing)
    if left == 0:
        services.store.finish_run(task.run_id, "finished")
    announce_stored(services, task.run_id)


def _timing(
    task: GenerateBatch,
    state: str,
    worker: str,
    attempt: int,
    device_used: str,
    started_at: float,
    load_ms: float,
    compute_ms: float,
) -> TaskTiming:
    return timing_of(
        task,
        kind=KIND_NAME,
        task_type="generate",
        task=task.task_name,
        round_index=None,
        state=state,
        worker=worker,
        attempt=attempt,
        device_used=device_used,
        started_at=started_at,
        load_ms=load_ms,
        compute_ms=compute_ms,
    )


def _elapsed_ms(start: float) -> float:
    return (time.perf_counter() - start) * 1000
