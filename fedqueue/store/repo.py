"""Store operations. All SQL goes through SQLAlchemy; no user value is ever formatted into SQL."""

from __future__ import annotations

import functools
import logging
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from typing import Any, TypeVar

from sqlalchemy import or_, select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.engine import Dialect, Engine
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session, sessionmaker

from fedqueue.errors import NotFound
from fedqueue.store.schema import RunRow, TaskTimingRow
from fedqueue.store.state_files import StateFiles

log = logging.getLogger(__name__)

F = TypeVar("F", bound=Callable[..., Any])
RETRY_DELAYS_S = (0.1, 0.3, 1.0, 2.0, 4.0)


def retry_transient(method: F) -> F:
    """Retry a store call when the database dropped the connection or stayed locked.

    Every decorated call is safe to repeat: reads, conditional updates, and inserts
    that ignore a row already there.
    """

    @functools.wraps(method)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        for delay in RETRY_DELAYS_S:
            try:
                return method(*args, **kwargs)
            except OperationalError as err:
                # Not a warning: the caller hears of a failure that outlasts these tries (a follower in one line).
                log.info("store call %s failed (%s); retrying in %.1f s", method.__name__, err.orig, delay)
                time.sleep(delay)
        return method(*args, **kwargs)

    return wrapper  # type: ignore[return-value]


def dialect_insert(dialect: Dialect) -> Any:
    """The dialect's INSERT (SQLite's or Postgres'), which can say what a conflict with an existing row does."""
    return pg_insert if dialect.name == "postgresql" else sqlite_insert


def taking_new(upsert: Any, columns: Iterable[str]) -> dict[str, Any]:
    """An upsert's update part where its row is there: `columns` take the inserted row's values (`excluded`),
    so each value is bound once, not again for the update (a bound value is copied: a 45 MB state twice)."""
    return {column: upsert.excluded[column] for column in columns}


def changed_one(result: Any) -> bool:
    """An UPDATE or DELETE touched exactly one row (a CursorResult's rowcount; typed as a plain Result)."""
    return int(result.rowcount) == 1


@dataclass(frozen=True)
class TaskTiming:
    """How one task of any job kind ran, as its worker measured it: a row of the shared timing table."""

    run_id: str
    kind: str
    task_type: str  # train, aggregate, generate
    task: str  # its name within the run, unique there
    round_index: int | None
    state: str
    worker: str
    device_used: str
    attempt: int
    enqueued_at: float
    started_at: float
    finished_at: float = field(default_factory=time.time)
    pid: int = field(default_factory=os.getpid)
    load_ms: float = 0.0
    compute_ms: float = 0.0
    upload_ms: float = 0.0
    error: str | None = None
    pack: str | None = None  # FL: the pack of devices this task was trained in


class Store:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._sessions = sessionmaker(engine, expire_on_commit=False)
        # Where a SQLite store keeps large states (None: in their rows); see state_files.
        self.state_files = StateFiles.beside(engine.url)
        # A task's timing row is its latest stored delivery's: a retried aggregation replaces the failed one's.
        # Public: a kind that stores its results and their timing in one transaction executes it too.
        timing = dialect_insert(engine.dialect)(TaskTimingRow)
        self.timing_upsert = timing.on_conflict_do_update(
            index_elements=["run_id", "task"],
            set_=taking_new(timing, (field for field in TaskTiming.__dataclass_fields__ if field != "run_id")),
        )

    def session(self) -> Session:
        return self._sessions()

    def close(self) -> None:
        self.engine.dispose()

    # runs

    def create_run(
        self,
        run_id: str,
        name: str,
        config: dict[str, Any],
        rounds_total: int,
        *,
        kind: str,
        broker_id: str | None = None,
    ) -> None:
        with self.session() as session, session.begin():
            session.add(
                RunRow(
                    id=run_id,
                    kind=kind,
                    name=name,
                    config=config,
                    state="running",
                    rounds_total=rounds_total,
                    created_at=time.time(),
                    broker_id=broker_id,
                )
            )

    @retry_transient
    def get_run(self, run_id: str) -> RunRow:
        with self.session() as session:
            row = session.get(RunRow, run_id)
        if row is None:
            raise NotFound(f"run {run_id!r} does not exist")
        return row

    @retry_transient
    def run_state(self, run_id: str) -> str | None:
        """A run's state alone (None when there is no such run): one column, read before each task of the run."""
        with self.session() as session:
            return session.scalar(select(RunRow.state).where(RunRow.id == run_id))

    def list_runs(self) -> list[RunRow]:
        with self.session() as session:
            return list(session.scalars(select(RunRow).order_by(RunRow.created_at)))

    @retry_transient
    def unleased_runs(self, created_before: float) -> list[str]:
        """Running runs whose lease is free or expired: nobody repairs them right now.

        Only runs created before `created_before`: a submitter that follows its run takes the lease first.
        """
        free = or_(RunRow.lease_owner.is_(None), RunRow.lease_expires_at < time.time())
        query = select(RunRow.id).where(RunRow.state == "running", RunRow.created_at < created_before, free)
        with self.session() as session:
            return list(session.scalars(query))

    @retry_transient
    def set_broker_id(self, run_id: str, broker_id: str) -> None:
        with self.session() as session, session.begin():
            session.execute(update(RunRow).where(RunRow.id == run_id).values(broker_id=broker_id))

    @retry_transient
    def finish_run(self, run_id: str, state: str, error: str | None = None) -> bool:
        """End a running run; False if it had already ended (a late finisher never overwrites the outcome)."""
        with self.session() as session, session.begin():
            result = session.execute(
                update(RunRow)
                .where(RunRow.id == run_id, RunRow.state == "running")
                .values(state=state, finished_at=time.time(), error=error)
            )
        return changed_one(result)

    @retry_transient
    def reopen_run(self, run_id: str) -> None:
        """Set an ended run running again: a job submitted again to generate what it has pending."""
        with self.session() as session, session.begin():
            session.execute(
                update(RunRow)
                .where(RunRow.id == run_id, RunRow.state != "running")
                .values(state="running", finished_at=None, error=None)
            )

    # leases

    @retry_transient
    def acquire_lease(self, run_id: str, owner: str, ttl_s: float) -> bool:
        """Hold (or renew) the right to schedule a run; False while another live holder has it."""
        now = time.time()
        free = or_(RunRow.lease_owner.is_(None), RunRow.lease_owner == owner, RunRow.lease_expires_at < now)
        with self.session() as session, session.begin():
            result = session.execute(
                update(RunRow).where(RunRow.id == run_id, free).values(lease_owner=owner, lease_expires_at=now + ttl_s)
            )
        return changed_one(result)

    @retry_transient
    def release_lease(self, run_id: str, owner: str) -> None:
        with self.session() as session, session.begin():
            session.execute(
                update(RunRow)
                .where(RunRow.id == run_id, RunRow.lease_owner == owner)
                .values(lease_owner=None, lease_expires_at=None)
            )

    # task timings

    @retry_transient
    def record_timing(self, timing: TaskTiming) -> None:
        """Store a task's timing (a second delivery of the same task replaces the first's)."""
        with self.engine.begin() as connection:
            connection.execute(self.timing_upsert, asdict(timing))

    @retry_transient
    def task_timings(self, run_id: str, round_index: int | None = None) -> list[TaskTimingRow]:
        """A run's task timings, every kind and type, in start order."""
        query = select(TaskTimingRow).where(TaskTimingRow.run_id == run_id)
        if round_index is not None:
            query = query.where(TaskTimingRow.round_index == round_index)
        with self.session() as session:
            return list(session.scalars(query.order_by(TaskTimingRow.started_at, TaskTimingRow.id)))
