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
from fedqueue.llm.pipelines.config import is_pipeline
from fedqueue.llm.pipelines.lane import give_up_lane, run_lane
from fedqueue.llm.pipelines.messages import PipelineLane
from fedqueue.llm.pipelines.repair import reconcile_pipeline
from fedqueue.llm.repair import reconcile
from fedqueue.llm.worker import ModelCache, fail_batch, run_batch
from fedqueue.report.kind import KindViews
from fedqueue.store import Store
from fedqueue.store.schema import RunRow

if TYPE_CHECKING:
    import typer

    from fedqueue.report.run_data import RunData

GENERATE_BATCH = "fedqueue.generate_batch"
PIPELINE_LANE = "fedqueue.pipeline_lane"


def _generate(context: TaskContext, task: GenerateBatch) -> None:
    run_batch(context.services, context.cache, task, context.worker, context.attempt)


def _batch_failed(context: TaskContext, task: GenerateBatch, attempts: int, error: str) -> None:
    fail_batch(context.services, task, context.worker, attempts, error)


def _lane(context: TaskContext, task: PipelineLane) -> None:
    run_lane(context.services, context.cache, task, context.worker, context.attempt)


def _lane_failed(context: TaskContext, task: PipelineLane, attempts: int, error: str) -> None:
    give_up_lane(context.services, task, error)


class LlmKind(JobKind, KindViews):
    name = KIND_NAME
    migrations = Path(__file__).with_name("migrations")
    handlers = (
        TaskHandler(GENERATE_BATCH, LLM_QUEUE, GenerateBatch, _generate, _batch_failed),
        TaskHandler(PIPELINE_LANE, LLM_QUEUE, PipelineLane, _lane, _lane_failed),
    )

    def repair(self, services: Services, run_id: str) -> list[str]:
        if is_pipeline(services.store.get_run(run_id).config):
            return reconcile_pipeline(services, run_id)
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
        from fedqueue.llm.pipelines.bars import ItemProgress

        if is_pipeline(services.store.get_run(run_id).config):
            return ItemProgress(services, run_id)
        return PromptProgress(services, run_id)

    def show_status(self, store: Store, run_id: str, as_json: bool, every_row: bool) -> bool:
        from fedqueue.llm.cli import show_status

        show_status(store, run_id, as_json)  # its tables are short: every row, always
        return True

    def report_numbers(self, store: Store, data: RunData, numbers: dict[str, Any]) -> dict[str, Any]:
        from fedqueue.llm.pipelines.summary import pipeline_summary
        from fedqueue.llm.summary import job_summary

        if is_pipeline(data.run.config):
            return {"job": pipeline_summary(store, data.run.id)}
        return {"job": job_summary(store, data.run.id)}

    def run_columns(self, store: Store, runs: Sequence[RunRow]) -> dict[str, dict[str, Any]]:
        """`fedqueue runs`: chat or plain prompts, or a pipeline; prompts generated (items ended) of all, the input
        file and model."""
        from fedqueue.llm.pipelines.rows import pipeline_counts
        from fedqueue.llm.results import done_counts

        jobs = [run for run in runs if not is_pipeline(run.config)]
        counts = done_counts(store, [run.id for run in jobs])
        columns = {
            run.id: {
                "type": "llm chat" if run.config.get("chat") else "llm",
                "progress": f"{counts[run.id][0]}/{counts[run.id][1]} prompts",
                "dataset": run.config.get("input"),
                "model": run.config.get("model"),
            }
            for run in jobs
        }
        for run in runs:
            if is_pipeline(run.config):
                items = pipeline_counts(store, run.id)
                ended = items.get("done", 0) + items.get("failed", 0)
                columns[run.id] = {
                    "type": "llm pipeline",
                    "progress": f"{ended}/{items.get('total', 0)} items",
                    "dataset": run.config.get("input"),
                    "model": run.config.get("model"),
                }
        return columns


KIND = LlmKind()
