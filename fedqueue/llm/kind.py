"""The LLM job kind, as the core sees it: one task (a batch of prompts), its repair pass, its commands."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fedqueue.config import Settings
from fedqueue.core.jobs import JobKind, RunProgress, TaskContext, TaskHandler
from fedqueue.core.services import Services
from fedqueue.llm.messages import KIND_NAME, LLM_QUEUE, GenerateBatch
from fedqueue.llm.repair import reconcile
from fedqueue.llm.worker import ModelCache, fail_batch, run_batch
from fedqueue.report.kind import KindViews
from fedqueue.store import Store
from fedqueue.store.schema import RunRow

if TYPE_CHECKING:
    import typer

    from fedqueue.report.run_data import RunData

GENERATE_BATCH = "fedqueue.generate_batch"


def _generate(context: TaskContext, task: GenerateBatch) -> None:
    run_batch(context.services, context.cache, task, context.worker, context.attempt)


def _batch_failed(context: TaskContext, task: GenerateBatch, attempts: int, error: str) -> None:
    fail_batch(context.services, task, context.worker, attempts, error)


class LlmKind(JobKind, KindViews):
    name = KIND_NAME
    migrations = Path(__file__).with_name("migrations")
    handlers = (TaskHandler(GENERATE_BATCH, LLM_QUEUE, GenerateBatch, _generate, _batch_failed),)

    def repair(self, services: Services, run_id: str) -> list[str]:
        return reconcile(services, run_id)

    def new_cache(self) -> ModelCache:
        return ModelCache()

    @contextlib.contextmanager
    def task_scope(self, settings: Settings) -> Iterator[None]:
        """The task's CPU threads, and never FL's deterministic kernels (slower, and some generate ops refuse
        them)."""
        import torch

        threads, deterministic = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
        torch.set_num_threads(settings.threads_per_task)
        torch.use_deterministic_algorithms(False)
        try:
            yield
        finally:
            torch.set_num_threads(threads)
            torch.use_deterministic_algorithms(deterministic)

    # The kind's commands and views (typer, rich) load in the command that shows them, never in a worker: hence
    # the imports inside these hooks.
    def commands(self) -> typer.Typer:
        from fedqueue.llm.cli import app

        return app

    def progress(self, services: Services, run_id: str) -> RunProgress:
        from fedqueue.llm.bars import PromptProgress

        return PromptProgress(services, run_id)

    def show_status(self, store: Store, run_id: str, as_json: bool, every_row: bool) -> bool:
        from fedqueue.llm.cli import show_status

        show_status(store, run_id, as_json)  # its tables are short: every row, always
        return True

    def report_numbers(self, store: Store, data: RunData, numbers: dict[str, Any]) -> dict[str, Any]:
        from fedqueue.llm.summary import job_summary

        return {"job": job_summary(store, data.run.id)}

    def run_columns(self, store: Store, runs: Sequence[RunRow]) -> dict[str, dict[str, Any]]:
        """`fedqueue runs`: chat or plain prompts, prompts generated of all, the input file and model."""
        from fedqueue.llm.results import done_counts

        counts = done_counts(store, [run.id for run in runs])
        return {
            run.id: {
                "type": "llm chat" if run.config.get("chat") else "llm",
                "progress": f"{counts[run.id][0]}/{counts[run.id][1]} prompts",
                "dataset": run.config.get("input"),
                "model": run.config.get("model"),
            }
            for run in runs
        }


KIND = LlmKind()
