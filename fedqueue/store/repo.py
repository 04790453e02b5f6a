"""Store operations. All SQL goes through SQLAlchemy; no user value is ever formatted into SQL."""

from __future__ import annotations

import functools
import logging
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, TypeVar

from sqlalchemy import and_, bindparam, delete, func, or_, select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.engine import Connection, Dialect, Engine, Row
from sqlalchemy.exc import IntegrityError, OperationalError
from sqlalchemy.orm import Session, sessionmaker

from fedqueue.errors import NotFound
from fedqueue.store.schema import CheckpointRow, DeviceTaskRow, RoundRow, RunRow, TaskTimingRow

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
                log.warning("store call %s failed (%s); retrying in %.1f s", method.__name__, err.orig, delay)
                time.sleep(delay)
        return method(*args, **kwargs)

    return wrapper  # type: ignore[return-value]


class _StoredBefore(Exception):
    """Rolls back an all-or-nothing store of results when one of them was stored before."""


def dialect_insert(dialect: Dialect) -> Any:
    """The dialect's INSERT (SQLite's or Postgres'), which can say what a conflict with an existing row does."""
    return pg_insert if dialect.name == "postgresql" else sqlite_insert


def _changed_one(result: Any) -> bool:
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


@dataclass(frozen=True)
class DeviceResult:
    """What a worker reports for one FL device: its result; its timing goes with it as a `TaskTiming`."""

    run_id: str
    round_index: int
    device: int
    state: str
    worker: str
    attempt: int
    samples: int = 0
    loss: float | None = None
    update_key: str | None = None
    update_sha256: str | None = None
    update_nbytes: int | None = None
    error: str | None = None


# What aggregating needs of each stored result: light rows, not ORM objects.
OUTCOME_COLUMNS = (
    DeviceTaskRow.device,
    DeviceTaskRow.state,
    DeviceTaskRow.samples,
    DeviceTaskRow.loss,
    DeviceTaskRow.error,
    DeviceTaskRow.update_key,
    DeviceTaskRow.update_sha256,
    DeviceTaskRow.update_nbytes,
)


class Store:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._sessions = sessionmaker(engine, expire_on_commit=False)
        insert = dialect_insert(engine.dialect)
        self._insert_result = (
            insert(DeviceTaskRow)
            .on_conflict_do_nothing(index_elements=["run_id", "round_index", "device"])
            .returning(DeviceTaskRow.id)  # rowcount of an INSERT is not reported by every driver
        )
        # A task's timing row is its latest stored delivery's: a retried aggregation replaces the failed one's.
        # Public: a kind that stores its results and their timing in one transaction executes it too.
        timing = insert(TaskTimingRow)
        self.timing_upsert = timing.on_conflict_do_update(
            index_elements=["run_id", "task"],
            set_={field: timing.excluded[field] for field in TaskTiming.__dataclass_fields__ if field != "run_id"},
        )
        this_round = (RoundRow.run_id == bindparam("run"), RoundRow.round_index == bindparam("round"))
        self._count_stored = (
            update(RoundRow).where(*this_round).values(stored=RoundRow.stored + 1).returning(RoundRow.stored)
        )
        this_device = (
            DeviceTaskRow.run_id == bindparam("run"),
            DeviceTaskRow.round_index == bindparam("round"),
            DeviceTaskRow.device == bindparam("device"),
        )
        self._rows_stored = select(func.count()).where(
            DeviceTaskRow.run_id == bindparam("run"), DeviceTaskRow.round_index == bindparam("round")
        )
        self._stored_update_key = select(DeviceTaskRow.update_key).where(*this_device)
        self._stored_count = select(RoundRow.stored).where(*this_round)

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
        kind: str = "fl",
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
        return _changed_one(result)

    @retry_transient
    def reopen_run(self, run_id: str) -> None:
        """Set an ended run running again: a job submitted again to generate what it has pending."""
        with self.session() as session, session.begin():
            session.execute(
                update(RunRow)
                .where(RunRow.id == run_id, RunRow.state != "running")
                .values(state="running", finished_at=None, error=None)
            )

    # rounds

    @retry_transient
    def add_round(self, row: RoundRow) -> bool:
        """Record a round; False when it is already there (another starter won: nothing to do)."""
        try:
            with self.session() as session, session.begin():
                session.add(row)
        except IntegrityError:
            return False
        return True

    @retry_transient
    def get_round(self, run_id: str, round_index: int) -> RoundRow | None:
        with self.session() as session:
            return session.scalars(
                select(RoundRow).where(RoundRow.run_id == run_id, RoundRow.round_index == round_index)
            ).one_or_none()

    @retry_transient
    def list_rounds(self, run_id: str) -> list[RoundRow]:
        with self.session() as session:
            return list(
                session.scalars(select(RoundRow).where(RoundRow.run_id == run_id).order_by(RoundRow.round_index))
            )

    @retry_transient
    def claim_round(self, run_id: str, round_index: int, owner: str, stale_before: float) -> bool:
        """Move a round from training to aggregating for `owner`; exactly one caller wins.

        An aggregating round whose claim was last renewed before `stale_before` (its
        holder died) can be claimed again; one that is renewed never is.
        """
        stale = and_(RoundRow.state == "aggregating", RoundRow.claimed_at < stale_before)
        with self.session() as session, session.begin():
            result = session.execute(
                update(RoundRow)
                .where(
                    RoundRow.run_id == run_id,
                    RoundRow.round_index == round_index,
                    or_(RoundRow.state == "training", stale),
                )
                .values(state="aggregating", claim_owner=owner, claimed_at=time.time())
            )
        return _changed_one(result)

    def _held(self, run_id: str, round_index: int, owner: str) -> tuple[Any, ...]:
        return (
            RoundRow.run_id == run_id,
            RoundRow.round_index == round_index,
            RoundRow.state == "aggregating",
            RoundRow.claim_owner == owner,
        )

    @retry_transient
    def renew_claim(self, run_id: str, round_index: int, owner: str) -> bool:
        """Keep an aggregation claim fresh; False once another aggregator took it over."""
        with self.session() as session, session.begin():
            result = session.execute(
                update(RoundRow).where(*self._held(run_id, round_index, owner)).values(claimed_at=time.time())
            )
        return _changed_one(result)

    @retry_transient
    def unclaim_round(self, run_id: str, round_index: int, owner: str) -> None:
        """Hand an aggregating round back (its aggregation failed), so it can be claimed again."""
        with self.session() as session, session.begin():
            session.execute(
                update(RoundRow)
                .where(*self._held(run_id, round_index, owner))
                .values(state="training", claim_owner=None, claimed_at=None)
            )

    @retry_transient
    def acquire_lease(self, run_id: str, owner: str, ttl_s: float) -> bool:
        """Hold (or renew) the right to schedule a run; False while another live holder has it."""
        now = time.time()
        free = or_(RunRow.lease_owner.is_(None), RunRow.lease_owner == owner, RunRow.lease_expires_at < now)
        with self.session() as session, session.begin():
            result = session.execute(
                update(RunRow).where(RunRow.id == run_id, free).values(lease_owner=owner, lease_expires_at=now + ttl_s)
            )
        return _changed_one(result)

    @retry_transient
    def release_lease(self, run_id: str, owner: str) -> None:
        with self.session() as session, session.begin():
            session.execute(
                update(RunRow)
                .where(RunRow.id == run_id, RunRow.lease_owner == owner)
                .values(lease_owner=None, lease_expires_at=None)
            )

    @retry_transient
    def delete_result(self, run_id: str, round_index: int, device: int) -> None:
        """Forget a stored result whose update blob was lost, so the device trains again."""
        with self.session() as session, session.begin():
            deleted = session.execute(
                delete(DeviceTaskRow).where(
                    DeviceTaskRow.run_id == run_id,
                    DeviceTaskRow.round_index == round_index,
                    DeviceTaskRow.device == device,
                )
            )
            if _changed_one(deleted):
                session.execute(
                    update(RoundRow)
                    .where(RoundRow.run_id == run_id, RoundRow.round_index == round_index)
                    .values(stored=RoundRow.stored - 1)
                )

    @retry_transient
    def complete_round(self, run_id: str, round_index: int, owner: str, state: str = "done", **metrics: Any) -> bool:
        """Close a round its `owner` holds; False when the claim was lost (someone else finishes it)."""
        with self.session() as session, session.begin():
            result = session.execute(
                update(RoundRow)
                .where(*self._held(run_id, round_index, owner))
                .values(state=state, aggregated_at=time.time(), **metrics)
            )
        return _changed_one(result)

    # device tasks

    @retry_transient
    def record_device_result(self, result: DeviceResult, timing: TaskTiming) -> int | None:
        """Insert the result and its timing unless another delivery's result is already stored.

        Returns how many results its round now has stored (counted in the same transaction,
        so the worker that stores a round's last result knows it), or None when another
        delivery's result was already there. A retry after a commit whose acknowledgement
        was lost finds its own row (the same update key, unique per delivery) and counts as stored.
        """
        with self.engine.begin() as connection:
            return self._record_one(connection, result, timing)

    @retry_transient
    def record_device_results(
        self, outcomes: Sequence[tuple[DeviceResult, TaskTiming]], all_or_nothing: bool = False
    ) -> list[int | None]:
        """`record_device_result` for several devices in one transaction (a vmapped pack's), one answer each.

        With `all_or_nothing`, one device stored before makes the transaction store none (all None):
        the results share one summed update, which counts for all of them or for none.
        """
        try:
            with self.engine.begin() as connection:
                counts = [self._record_one(connection, result, timing) for result, timing in outcomes]
                if all_or_nothing and None in counts:
                    raise _StoredBefore()
                return counts
        except _StoredBefore:
            return [None] * len(outcomes)

    def _record_one(self, connection: Connection, result: DeviceResult, timing: TaskTiming) -> int | None:
        # Statements built once, values bound per call: building them per call cost 6x the insert.
        where = {"run": result.run_id, "round": result.round_index}
        if connection.execute(self._insert_result, asdict(result)).first() is None:
            stored_key = connection.execute(self._stored_update_key, {**where, "device": result.device}).scalar()
            if result.update_key is None or stored_key != result.update_key:
                return None
            count = connection.execute(self._stored_count, where).scalar()
        else:
            count = connection.execute(self._count_stored, where).scalar()
        connection.execute(self.timing_upsert, asdict(timing))
        if count is None:  # no round row (only in tests of the store alone): count the rows
            count = connection.execute(self._rows_stored, where).scalar()
        return int(count or 0)

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

    @retry_transient
    def has_result(self, run_id: str, round_index: int, device: int) -> bool:
        with self.session() as session:
            found = session.scalar(
                select(DeviceTaskRow.id).where(
                    DeviceTaskRow.run_id == run_id,
                    DeviceTaskRow.round_index == round_index,
                    DeviceTaskRow.device == device,
                )
            )
        return found is not None

    @retry_transient
    def unstored_devices(self, run_id: str, round_index: int, devices: Sequence[int]) -> list[int]:
        """Which of `devices` have no result stored (done or failed) in the round, in their order."""
        with self.engine.connect() as connection:
            stored = set(
                connection.execute(
                    select(DeviceTaskRow.device).where(
                        DeviceTaskRow.run_id == run_id,
                        DeviceTaskRow.round_index == round_index,
                        DeviceTaskRow.device.in_(list(devices)),
                    )
                ).scalars()
            )
        return [device for device in devices if device not in stored]

    @retry_transient
    def count_done(self, run_id: str, round_index: int) -> int:
        """Result rows stored for a round (done or failed), counted from the rows themselves."""
        with self.engine.connect() as connection:
            return connection.execute(self._rows_stored, {"run": run_id, "round": round_index}).scalar() or 0

    @retry_transient
    def device_tasks(self, run_id: str, round_index: int | None = None) -> list[DeviceTaskRow]:
        query = select(DeviceTaskRow).where(DeviceTaskRow.run_id == run_id)
        if round_index is not None:
            query = query.where(DeviceTaskRow.round_index == round_index)
        with self.session() as session:
            return list(session.scalars(query.order_by(DeviceTaskRow.round_index, DeviceTaskRow.device)))

    @retry_transient
    def round_outcomes(self, run_id: str, round_index: int) -> list[Row[Any]]:
        """What aggregating a round needs of each result, by device: light rows, not ORM objects."""
        query = (
            select(*OUTCOME_COLUMNS)
            .where(DeviceTaskRow.run_id == run_id, DeviceTaskRow.round_index == round_index)
            .order_by(DeviceTaskRow.device)
        )
        with self.engine.connect() as connection:
            return list(connection.execute(query))

    # checkpoints

    @retry_transient
    def save_checkpoint(self, run_id: str, version: int, sha256: str, data: bytes) -> None:
        with self.session() as session, session.begin():
            session.execute(delete(CheckpointRow).where(CheckpointRow.run_id == run_id))
            session.add(CheckpointRow(run_id=run_id, version=version, sha256=sha256, data=data))

    @retry_transient
    def load_checkpoint(self, run_id: str) -> CheckpointRow | None:
        with self.session() as session:
            return session.get(CheckpointRow, run_id)

    def round_rows_for(self, run_ids: Sequence[str]) -> dict[str, list[RoundRow]]:
        with self.session() as session:
            rows = session.scalars(select(RoundRow).where(RoundRow.run_id.in_(run_ids)))
            grouped: dict[str, list[RoundRow]] = {run_id: [] for run_id in run_ids}
            for row in rows:
                grouped[row.run_id].append(row)
        return grouped
