"""The FL job kind, as the core sees it: its device task and its strategies' control tasks, its repair pass, its
per-task process settings."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fedqueue.config import Settings
from fedqueue.core.jobs import JobKind, Question, RunProgress, TaskContext, TaskHandler
from fedqueue.core.process.writable import writable_folder
from fedqueue.core.services import Services
from fedqueue.errors import ConfigError
from fedqueue.fl.config import RunConfig
from fedqueue.fl.messages import DEVICES_QUEUE, KIND_NAME, DeviceTask
from fedqueue.fl.ml.warmup import warm_up
from fedqueue.fl.scheduler import reconcile
from fedqueue.fl.store.results import reopen_failed_rounds
from fedqueue.fl.strategy.base import Strategy
from fedqueue.fl.strategy.registry import control_handlers, entry_for, strategy_for
from fedqueue.fl.submit.prepare import PREPARE_QUESTION, answer_prepare
from fedqueue.fl.worker.admission import refusal
from fedqueue.fl.worker.cache import WorkerCache
from fedqueue.fl.worker.device_task import give_up_on, run_device_task
from fedqueue.report.kind import KindViews
from fedqueue.store import Store
from fedqueue.store.schema import RunRow

if TYPE_CHECKING:
    import typer

    from fedqueue.report.html import KindPage
    from fedqueue.report.run_data import RunData
    from fedqueue.report.timeline import Span

TRAIN_DEVICE = "fedqueue.train_device"


def _strategy(context: TaskContext, run_id: str) -> Strategy:
    return strategy_for(context.cache.run_config(context.services, run_id))


def _device_label() -> str:
    # torch: the kind is loaded by every command; only a worker's tasks load torch.
    from fedqueue.fl.ml.torch_device import device_label

    return device_label()


def _refusal(services: Services, cache: WorkerCache, task: DeviceTask) -> str | None:
    return refusal(services, cache, task, strategy_for(cache.run_config(services, task.run_id)))


def _train(context: TaskContext, task: DeviceTask) -> None:
    strategy = _strategy(context, task.run_id)
    run_device_task(context.services, context.cache, task, context.worker, context.attempt, strategy)


def _device_failed(context: TaskContext, task: DeviceTask, attempts: int, error: str) -> None:
    strategy = _strategy(context, task.run_id)
    give_up_on(context.services, task, context.worker, attempts, error, strategy, _device_label())


class FlKind(JobKind, KindViews):
    name = KIND_NAME
    migrations = Path(__file__).parent / "store" / "migrations"
    handlers = (
        TaskHandler(TRAIN_DEVICE, DEVICES_QUEUE, DeviceTask, _train, _device_failed, refusal=_refusal),
        *control_handlers(),
    )
    questions = (Question(PREPARE_QUESTION, answer_prepare),)
    commands_at_top = True

    def repair(self, services: Services, run_id: str) -> list[str]:
        return reconcile(services, run_id)

    def new_cache(self) -> WorkerCache:
        return WorkerCache()

    def retry_failed(self, services: Services, run_id: str) -> list[str]:
        run = services.store.get_run(run_id)
        config = RunConfig.from_stored(run.config)
        if entry_for(config).mode.asynchronous and "on_failure = 'abort'" in (run.error or ""):
            # The schedule already folded on without the device: a retry could not give the run's own weights.
            raise ConfigError(f"run {run_id} stopped on a failed device under on_failure = 'abort': submit it again")
        return [
            f"round {round_index}: failed devices {', '.join(map(str, devices)) or 'none'} train again"
            for round_index, devices in reopen_failed_rounds(services.store, run_id)
        ]

    @contextlib.contextmanager
    def task_scope(self, settings: Settings) -> Iterator[None]:
        """FL tasks run with a fixed thread count and, on a GPU, deterministic kernels; other kinds get theirs
        back."""
        # torch, as in _device_label.
        import torch

        from fedqueue.fl.ml.torch_device import configure_determinism

        threads, deterministic = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
        configure_determinism(settings.threads_per_task)
        try:
            yield
        finally:
            torch.set_num_threads(threads)
            torch.use_deterministic_algorithms(deterministic)

    def warm_up(self, settings: Settings) -> None:
        # No task scope here: the warm-up runs beside tasks, and restoring the thread
        # count or kernel choice on its way out would change them under a running task.
        warm_up()

    # The kind's commands and views (typer, rich, the report's pictures) load in the command that shows them, never
    # in a worker: hence the imports inside these hooks.
    def commands(self) -> typer.Typer:
        from fedqueue.fl.cli import app

        return app

    def progress(self, services: Services, run_id: str) -> RunProgress:
        from fedqueue.fl.view.bars import RoundProgress
        from fedqueue.fl.view.tensorboard import with_scalars

        # The follower writes the run's TensorBoard files, when its config asks for them, on the polls that read
        # its bars.
        return with_scalars(RoundProgress(services.store, run_id), services.store, run_id)

    def tensorboard(self, store: Store, run_id: str, root: Path) -> tuple[Path, int]:
        from fedqueue.fl.view.tensorboard import write_run_scalars

        return write_run_scalars(store, run_id, writable_folder(root, "--tensorboard"))

    def show_status(self, store: Store, run_id: str, as_json: bool, every_row: bool) -> bool:
        from fedqueue.fl.cli import show_status

        show_status(store, run_id, as_json, every_row)
        return True

    # The FL parts of a run's status, report and `fedqueue runs` line.

    def summary(self, store: Store, run: RunRow, spans: Sequence[Span]) -> dict[str, Any]:
        from fedqueue.fl.view.summary import run_status

        return run_status(store, run, spans)

    def report_numbers(self, store: Store, data: RunData, numbers: dict[str, Any]) -> dict[str, Any]:
        from fedqueue.fl.view.report import report_numbers

        return report_numbers(store, data, numbers)

    def report_page(self, numbers: dict[str, Any]) -> KindPage:
        from fedqueue.fl.view.report import report_page

        return report_page(numbers)

    def run_columns(self, store: Store, runs: Sequence[RunRow]) -> dict[str, dict[str, Any]]:
        from fedqueue.fl.view.summary import run_columns

        return run_columns(store, runs)


KIND = FlKind()
