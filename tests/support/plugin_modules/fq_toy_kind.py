"""A third job kind, written outside fedqueue: it squares numbers, one task per number.

It reaches the core only as any kind does: a `JobKind` found through the `fedqueue.jobs` entry
points, a `Submission` for the front door, its own table for its results, made by its own schema
branch (fq_toy_migrations/). Nothing in the core names it. tests/core/test_third_kind.py installs it (an entry point in a plugin folder) and runs it.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer
from sqlalchemy import Integer, String, select
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from fedqueue.config import Settings
from fedqueue.core.codec import MessageError, require_fields
from fedqueue.core.jobs import JobKind, TaskContext, TaskHandler
from fedqueue.core.services import Services
from fedqueue.core.timing import timing_of
from fedqueue.store import Store
from fedqueue.store.repo import TaskTiming, dialect_insert

KIND_NAME = "toy"
QUEUE = "toy"


class ToyBase(DeclarativeBase):
    pass


class SquareRow(ToyBase):
    """The kind's own table: one square per number of a run."""

    __tablename__ = "toy_squares"
    run_id: Mapped[str] = mapped_column(String(32), primary_key=True)
    number: Mapped[int] = mapped_column(Integer, primary_key=True)
    square: Mapped[int] = mapped_column(Integer)
    worker: Mapped[str] = mapped_column(String(200))


def squares(store: Store, run_id: str) -> dict[int, int]:
    with store.engine.connect() as connection:
        rows = connection.execute(select(SquareRow.number, SquareRow.square).where(SquareRow.run_id == run_id))
        return {number: square for number, square in rows}


@dataclass(frozen=True)
class Square:
    run_id: str
    number: int
    count: int
    sleep_s: float
    enqueued_at: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "number": self.number,
            "count": self.count,
            "sleep_s": self.sleep_s,
            "enqueued_at": self.enqueued_at,
        }

    @classmethod
    def from_dict(cls, raw: Any) -> Square:
        fields: dict[str, type | tuple[type, ...]] = {
            "run_id": str,
            "number": int,
            "count": int,
            "sleep_s": (int, float),
            "enqueued_at": (int, float),
        }
        require_fields(raw, fields, "square")
        if not 0 <= raw["number"] < raw["count"] <= 10_000:
            raise MessageError("square.number: out of range")
        return cls(raw["run_id"], raw["number"], raw["count"], float(raw["sleep_s"]), float(raw["enqueued_at"]))

    @property
    def attempt_key(self) -> str:
        return f"toy:{self.run_id}:{self.number}"

    @property
    def label(self) -> str:
        return f"toy {self.run_id} square {self.number}"


def _timing(task: Square, context: TaskContext, state: str, started_at: float, error: str | None = None) -> TaskTiming:
    return timing_of(
        task,
        kind=KIND_NAME,
        task_type="square",
        task=f"square {task.number}",
        round_index=None,
        state=state,
        worker=context.worker,
        device_used="cpu",
        attempt=context.attempt,
        started_at=started_at,
        compute_ms=(time.time() - started_at) * 1000,
        error=error,
    )


def _square(context: TaskContext, task: Square) -> None:
    started_at = time.time()
    time.sleep(task.sleep_s)  # stands for work, so that tasks on two workers overlap
    store = context.services.store
    row = {"run_id": task.run_id, "number": task.number, "square": task.number**2, "worker": context.worker}
    with store.engine.begin() as connection:  # a redelivered task stores its square once
        connection.execute(dialect_insert(store.engine.dialect)(SquareRow).values(**row).on_conflict_do_nothing())
    store.record_timing(_timing(task, context, "done", started_at))
    if len(squares(store, task.run_id)) == task.count:
        store.finish_run(task.run_id, "finished")


def _give_up(context: TaskContext, task: Square, attempts: int, error: str) -> None:
    context.services.store.record_timing(_timing(task, context, "failed", time.time(), error))
    context.services.store.finish_run(task.run_id, "failed", f"square {task.number} failed {attempts} times")


@dataclass(frozen=True)
class SquaresJob:
    """Square the numbers 0 .. count-1, one task each."""

    count: int
    sleep_s: float = 0.0

    def check(self, settings: Settings) -> None:
        from fedqueue.errors import ConfigError

        if not 1 <= self.count <= 10_000:
            raise ConfigError(f"--count: expected 1 to 10000, got {self.count}")

    def submit(self, services: Services) -> str:
        run_id = f"toy-{uuid.uuid4().hex[:8]}"
        config = {"count": self.count, "sleep_s": self.sleep_s}
        services.store.create_run(run_id, "squares", config, 0, kind=KIND_NAME, broker_id=services.ledger.broker_id())
        now = time.time()
        services.enqueue([Square(run_id, number, self.count, self.sleep_s, now) for number in range(self.count)])
        print(f"toy job {run_id} submitted: {self.count} numbers")
        return run_id


class ToyKind(JobKind):
    name = KIND_NAME
    # Its table comes from a schema branch of its own, upgraded with the core's by every migrating process.
    migrations = Path(__file__).with_name("fq_toy_migrations")
    handlers = (TaskHandler("fedqueue_toy.square", QUEUE, Square, _square, _give_up),)

    def repair(self, services: Services, run_id: str) -> list[str]:
        return []

    def commands(self) -> typer.Typer:
        """`fedqueue toy ...`, made only when the CLI asks (the CLI imports the kinds as it starts)."""
        from fedqueue.cli.common import friendly_errors
        from fedqueue.cli.launch import exit_unless_finished, submit_and_follow

        app = typer.Typer(no_args_is_help=True, help="Squares numbers: the toy job kind of fedqueue's tests.")

        @app.command("run")
        @friendly_errors
        def run_squares(
            count: Annotated[int, typer.Option(help="How many numbers to square.")] = 8,
            sleep_ms: Annotated[int, typer.Option(help="How long each task works.")] = 0,
        ) -> None:
            """Square the numbers and follow the job to the end."""
            handle = submit_and_follow(SquaresJob(count, sleep_ms / 1000), Settings.from_env())
            exit_unless_finished(handle)

        return app


KIND = ToyKind()
