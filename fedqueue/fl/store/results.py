"""The FL job kind's rows in the store: rounds and their claims, device results, checkpoints.

Functions on the core `Store` (as the LLM kind's `fedqueue.llm.results`): a round is recorded once, claimed by
one aggregator at a time, and each device's result is stored once, counted in its round in the same transaction.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any, NamedTuple

from sqlalchemy import and_, bindparam, delete, func, insert, or_, select, update
from sqlalchemy.engine import Connection, Dialect, Row
from sqlalchemy.exc import IntegrityError

from fedqueue.fl.store.schema import CheckpointRow, DeviceTaskRow, ModelVersionRow, RoundRow
from fedqueue.fl.store.states import CHECKPOINTS, remove_states, row_bytes, state_bytes, unnamed
from fedqueue.store.repo import Store, TaskTiming, changed_one, dialect_insert, retry_transient

log = logging.getLogger(__name__)


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

# Statements built once, values bound per call: building them per call cost 6x the insert.
_THIS_ROUND = (RoundRow.run_id == bindparam("run"), RoundRow.round_index == bindparam("round"))
_COUNT_STORED = update(RoundRow).where(*_THIS_ROUND).values(stored=RoundRow.stored + 1).returning(RoundRow.stored)
_ROWS_STORED = select(func.count()).where(
    DeviceTaskRow.run_id == bindparam("run"), DeviceTaskRow.round_index == bindparam("round")
)
_STORED_UPDATE_KEY = select(DeviceTaskRow.update_key).where(
    DeviceTaskRow.run_id == bindparam("run"),
    DeviceTaskRow.round_index == bindparam("round"),
    DeviceTaskRow.device == bindparam("device"),
)
_STORED_COUNT = select(RoundRow.stored).where(*_THIS_ROUND)
_SELECTED = select(RoundRow.selected).where(*_THIS_ROUND)


# The result INSERT that leaves a row already there alone, by dialect name (built on first use of each).
_insert_results: dict[str, Any] = {}


def _insert_result(dialect: Dialect) -> Any:
    statement = _insert_results.get(dialect.name)
    if statement is None:
        statement = _insert_results[dialect.name] = (
            dialect_insert(dialect)(DeviceTaskRow)
            .on_conflict_do_nothing(index_elements=["run_id", "round_index", "device"])
            .returning(DeviceTaskRow.id)  # rowcount of an INSERT is not reported by every driver
        )
    return statement


class _StoredBefore(Exception):
    """Rolls back an all-or-nothing store of results when one of them was stored before."""


# rounds


@retry_transient
def add_round(store: Store, row: RoundRow) -> bool:
    """Record a round; False when it is already there (another starter won: nothing to do)."""
    try:
        with store.session() as session, session.begin():
            session.add(row)
    except IntegrityError:
        return False
    return True


@retry_transient
def get_round(store: Store, run_id: str, round_index: int) -> RoundRow | None:
    with store.session() as session:
        return session.scalars(
            select(RoundRow).where(RoundRow.run_id == run_id, RoundRow.round_index == round_index)
        ).one_or_none()


@retry_transient
def list_rounds(store: Store, run_id: str, after: int = 0) -> list[RoundRow]:
    """A run's rounds in order; only those numbered above `after` if given."""
    query = select(RoundRow).where(RoundRow.run_id == run_id, RoundRow.round_index > after)
    with store.session() as session:
        return list(session.scalars(query.order_by(RoundRow.round_index)))


@retry_transient
def last_rounds(store: Store, run_id: str, count: int) -> list[RoundRow]:
    """A run's last `count` rounds, in order."""
    query = select(RoundRow).where(RoundRow.run_id == run_id).order_by(RoundRow.round_index.desc()).limit(count)
    with store.session() as session:
        return list(reversed(list(session.scalars(query))))


def round_rows_for(store: Store, run_ids: Sequence[str]) -> dict[str, list[RoundRow]]:
    with store.session() as session:
        rows = session.scalars(select(RoundRow).where(RoundRow.run_id.in_(run_ids)))
        grouped: dict[str, list[RoundRow]] = {run_id: [] for run_id in run_ids}
        for row in rows:
            grouped[row.run_id].append(row)
    return grouped


def claim_is_stale(row: RoundRow, ttl_s: float) -> bool:
    """An aggregating round whose claim was not renewed for a claim period: its holder is gone."""
    return (row.claimed_at or 0) < time.time() - ttl_s


@retry_transient
def claim_round(store: Store, run_id: str, round_index: int, owner: str, stale_before: float) -> bool:
    """Move a round from training to aggregating for `owner`; exactly one caller wins.

    An aggregating round whose claim was last renewed before `stale_before` (its
    holder died) can be claimed again; one that is renewed never is.
    """
    stale = and_(RoundRow.state == "aggregating", RoundRow.claimed_at < stale_before)
    with store.session() as session, session.begin():
        result = session.execute(
            update(RoundRow)
            .where(
                RoundRow.run_id == run_id,
                RoundRow.round_index == round_index,
                or_(RoundRow.state == "training", stale),
            )
            .values(state="aggregating", claim_owner=owner, claimed_at=time.time())
        )
    return changed_one(result)


def _held(run_id: str, round_index: int, owner: str) -> tuple[Any, ...]:
    return (
        RoundRow.run_id == run_id,
        RoundRow.round_index == round_index,
        RoundRow.state == "aggregating",
        RoundRow.claim_owner == owner,
    )


@retry_transient
def renew_claim(store: Store, run_id: str, round_index: int, owner: str) -> bool:
    """Keep an aggregation claim fresh; False once another aggregator took it over."""
    with store.session() as session, session.begin():
        result = session.execute(
            update(RoundRow).where(*_held(run_id, round_index, owner)).values(claimed_at=time.time())
        )
    return changed_one(result)


@retry_transient
def unclaim_round(store: Store, run_id: str, round_index: int, owner: str) -> None:
    """Hand an aggregating round back (its aggregation failed), so it can be claimed again."""
    with store.session() as session, session.begin():
        session.execute(
            update(RoundRow)
            .where(*_held(run_id, round_index, owner))
            .values(state="training", claim_owner=None, claimed_at=None)
        )


@retry_transient
def complete_round(
    store: Store, run_id: str, round_index: int, owner: str, state: str = "done", **metrics: Any
) -> bool:
    """Close a round its `owner` holds; False when the claim was lost (someone else finishes it)."""
    with store.session() as session, session.begin():
        result = session.execute(
            update(RoundRow)
            .where(*_held(run_id, round_index, owner))
            .values(state=state, aggregated_at=time.time(), **metrics)
        )
    return changed_one(result)


# device results


@retry_transient
def record_device_result(store: Store, result: DeviceResult, timing: TaskTiming) -> int | None:
    """Insert the result and its timing unless another delivery's result is already stored, or its round
    never sent the device out (refused and logged: only work the scheduler sent is taken).

    Returns how many results its round now has stored (counted in the same transaction,
    so the worker that stores a round's last result knows it), or None when another
    delivery's result was already there. A retry after a commit whose acknowledgement
    was lost finds its own row (the same update key, unique per delivery) and counts as stored.
    """
    with store.engine.begin() as connection:
        return _record_one(store, connection, result, timing, _Selection(connection))


@retry_transient
def record_device_results(
    store: Store, outcomes: Sequence[tuple[DeviceResult, TaskTiming]], all_or_nothing: bool = False
) -> list[int | None]:
    """`record_device_result` for several devices in one transaction (a vmapped pack's), one answer each.

    With `all_or_nothing`, one device stored before makes the transaction store none (all None):
    the results share one summed update, which counts for all of them or for none.
    """
    try:
        with store.engine.begin() as connection:
            selection = _Selection(connection)
            counts = [_record_one(store, connection, result, timing, selection) for result, timing in outcomes]
            if all_or_nothing and None in counts:
                raise _StoredBefore()
            return counts
    except _StoredBefore:
        return [None] * len(outcomes)


class _Selection:
    """The devices each round sent out, read once per transaction: only their results are taken."""

    def __init__(self, connection: Connection) -> None:
        self._connection = connection
        self._rounds: dict[tuple[str, int], frozenset[int]] = {}

    def has(self, result: DeviceResult) -> bool:
        key = (result.run_id, result.round_index)
        if key not in self._rounds:
            selected = self._connection.execute(_SELECTED, {"run": key[0], "round": key[1]}).scalar()
            self._rounds[key] = frozenset(selected or ())
        return result.device in self._rounds[key]


def _record_one(
    store: Store, connection: Connection, result: DeviceResult, timing: TaskTiming, selection: _Selection
) -> int | None:
    where = {"run": result.run_id, "round": result.round_index}
    if not selection.has(result):
        # Never sent by the scheduler (a forged task got this far): neither stored nor counted.
        log.error(
            "run %s round %d: a result for device %d, which the round never sent out, refused",
            result.run_id,
            result.round_index,
            result.device,
        )
        return None
    if connection.execute(_insert_result(connection.dialect), asdict(result)).first() is None:
        stored_key = connection.execute(_STORED_UPDATE_KEY, {**where, "device": result.device}).scalar()
        if result.update_key is None or stored_key != result.update_key:
            return None
        count = connection.execute(_STORED_COUNT, where).scalar()
    else:
        count = connection.execute(_COUNT_STORED, where).scalar()
    connection.execute(store.timing_upsert, asdict(timing))
    return int(count or 0)


@retry_transient
def delete_result(store: Store, run_id: str, round_index: int, device: int) -> None:
    """Forget a stored result whose update blob was lost, so the device trains again."""
    with store.session() as session, session.begin():
        deleted = session.execute(
            delete(DeviceTaskRow).where(
                DeviceTaskRow.run_id == run_id,
                DeviceTaskRow.round_index == round_index,
                DeviceTaskRow.device == device,
            )
        )
        if changed_one(deleted):
            session.execute(
                update(RoundRow)
                .where(RoundRow.run_id == run_id, RoundRow.round_index == round_index)
                .values(stored=RoundRow.stored - 1)
            )


def reopen_failed_rounds(store: Store, run_id: str) -> list[tuple[int, list[int]]]:
    """Rounds that stopped their run (a device failed under its policy) train again: their failed devices'
    results are forgotten and the round waits for them; returns (round, devices forgotten) for each."""
    reopened: list[tuple[int, list[int]]] = []
    with store.session() as session, session.begin():
        rounds = session.scalars(select(RoundRow).where(RoundRow.run_id == run_id, RoundRow.state == "failed"))
        for row in rounds:
            devices = list(
                session.scalars(
                    select(DeviceTaskRow.device).where(
                        DeviceTaskRow.run_id == run_id,
                        DeviceTaskRow.round_index == row.round_index,
                        DeviceTaskRow.state == "failed",
                    )
                )
            )
            session.execute(
                delete(DeviceTaskRow).where(
                    DeviceTaskRow.run_id == run_id,
                    DeviceTaskRow.round_index == row.round_index,
                    DeviceTaskRow.state == "failed",
                )
            )
            row.stored -= len(devices)
            row.state, row.claim_owner, row.claimed_at, row.aggregated_at = "training", None, None, None
            reopened.append((row.round_index, sorted(devices)))
    return reopened


@retry_transient
def has_result(store: Store, run_id: str, round_index: int, device: int) -> bool:
    with store.session() as session:
        found = session.scalar(
            select(DeviceTaskRow.id).where(
                DeviceTaskRow.run_id == run_id,
                DeviceTaskRow.round_index == round_index,
                DeviceTaskRow.device == device,
            )
        )
    return found is not None


@retry_transient
def unstored_devices(store: Store, run_id: str, round_index: int, devices: Sequence[int]) -> list[int]:
    """Which of `devices` have no result stored (done or failed) in the round, in their order."""
    with store.engine.connect() as connection:
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
def count_done(store: Store, run_id: str, round_index: int) -> int:
    """Result rows stored for a round (done or failed), counted from the rows themselves."""
    with store.engine.connect() as connection:
        return connection.execute(_ROWS_STORED, {"run": run_id, "round": round_index}).scalar() or 0


@retry_transient
def device_tasks(store: Store, run_id: str, round_index: int | None = None) -> list[DeviceTaskRow]:
    query = select(DeviceTaskRow).where(DeviceTaskRow.run_id == run_id)
    if round_index is not None:
        query = query.where(DeviceTaskRow.round_index == round_index)
    with store.session() as session:
        return list(session.scalars(query.order_by(DeviceTaskRow.round_index, DeviceTaskRow.device)))


class DeviceOutcome(NamedTuple):
    """What became of a device's task, without its update: what the status and report count."""

    round_index: int
    device: int
    state: str
    worker: str
    attempt: int
    error: str | None
    fate: str | None
    staleness: int | None


_OUTCOME_OF_DEVICE = [getattr(DeviceTaskRow, name) for name in DeviceOutcome._fields]


@retry_transient
def device_outcomes(store: Store, run_id: str) -> list[DeviceOutcome]:
    """Every device task's outcome in a run, by round and device: plain rows (a long run has 100,000)."""
    query = (
        select(*_OUTCOME_OF_DEVICE)
        .where(DeviceTaskRow.run_id == run_id)
        .order_by(DeviceTaskRow.round_index, DeviceTaskRow.device)
    )
    with store.engine.connect() as connection:
        return [DeviceOutcome(*row) for row in connection.execute(query)]


@retry_transient
def round_outcomes(store: Store, run_id: str, round_index: int) -> list[Row[Any]]:
    """What aggregating a round needs of each result, by device: light rows, not ORM objects."""
    query = (
        select(*OUTCOME_COLUMNS)
        .where(DeviceTaskRow.run_id == run_id, DeviceTaskRow.round_index == round_index)
        .order_by(DeviceTaskRow.device)
    )
    with store.engine.connect() as connection:
        return list(connection.execute(query))


# checkpoints


@retry_transient
def save_checkpoint(store: Store, run_id: str, version: int, sha256: str, data: bytes | memoryview) -> None:
    kept = row_bytes(store, run_id, sha256, data)
    with store.engine.begin() as connection:
        before = connection.execute(
            delete(CHECKPOINTS).where(CHECKPOINTS.c.run_id == run_id).returning(CHECKPOINTS.c.sha256)
        ).scalars()
        replaced = set(before) - {sha256}
        connection.execute(insert(CHECKPOINTS).values(run_id=run_id, version=version, sha256=sha256, data=kept))
        gone = unnamed(connection, run_id, replaced) if store.state_files is not None else set()
    remove_states(store, run_id, gone)


# A checkpoint's bytes when they are those of the run's kept version of the same number (a buffered run's
# model_versions row, written in the same transaction), or in the state file its sha256 names (a SQLite
# store): a state is never empty, so nothing else reads as this.
IN_KEPT_VERSION = b""


@retry_transient
def load_checkpoint(store: Store, run_id: str) -> CheckpointRow | None:
    """The run's latest checkpoint, its bytes read from its state file or the kept version it names when it
    holds none itself."""
    version = None
    for _ in range(_READS):
        with store.session() as session:
            checkpoint = session.get(CheckpointRow, run_id)
            if checkpoint is None or len(checkpoint.data) != len(IN_KEPT_VERSION):
                return checkpoint
            version = checkpoint.version
            data = state_bytes(store, run_id, checkpoint.sha256, checkpoint.data)
            if data is None:
                kept = session.get(ModelVersionRow, (run_id, checkpoint.version))
                data = None if kept is None else state_bytes(store, run_id, kept.sha256, kept.data)
            if data is not None:
                return CheckpointRow(run_id=run_id, version=checkpoint.version, sha256=checkpoint.sha256, data=data)
        # Its file went with the commit of a newer checkpoint since the row was read: read that one.
    raise RuntimeError(f"run {run_id}: checkpoint of version {version} names a version not kept")


# Reads of a checkpoint whose state went in between, before that is an error (one newer commit explains one).
_READS = 3
