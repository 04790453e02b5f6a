"""A buffered-async run's schedule in the store: its state, the one fold pass that holds it, its updates' fates.

The schedule row is claimed like a round: one conditional UPDATE, exactly one holder, renewed
while it works and taken over only once its holder stops renewing it (its worker died).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any, cast

from sqlalchemy import Connection, Row, Table, and_, bindparam, delete, func, or_, select, update
from sqlalchemy.exc import IntegrityError

from fedqueue.fl.store.results import IN_KEPT_VERSION, OUTCOME_COLUMNS
from fedqueue.fl.store.schema import CheckpointRow, DeviceTaskRow, ModelVersionRow, RoundRow, ScheduleRow
from fedqueue.fl.store.states import remove_states, row_bytes, state_bytes, unnamed
from fedqueue.store.repo import Store, TaskTiming, changed_one, dialect_insert, retry_transient, taking_new
from fedqueue.store.schema import RunRow

SCHEDULES = cast(Table, ScheduleRow.__table__)
VERSIONS = cast(Table, ModelVersionRow.__table__)
ROUNDS = cast(Table, RoundRow.__table__)
RUNS = cast(Table, RunRow.__table__)
CHECKPOINTS = cast(Table, CheckpointRow.__table__)

# What a fold pass writes on an update's row once it is taken in simulated order.
FATE_FIELDS = ("sim_dispatched", "sim_arrived", "fate", "staleness", "weight", "folded_into")


@retry_transient
def create_schedule(store: Store, run_id: str, state: dict[str, Any], version: int) -> bool:
    """Record a run's first schedule; False when it is already there (a second starter)."""
    try:
        with store.session() as session, session.begin():
            session.add(ScheduleRow(run_id=run_id, state=state, version=version, updated_at=time.time()))
    except IntegrityError:
        return False
    return True


@retry_transient
def get_schedule(store: Store, run_id: str) -> ScheduleRow | None:
    with store.session() as session:
        return session.get(ScheduleRow, run_id)


@retry_transient
def claim_schedule(store: Store, run_id: str, owner: str, stale_before: float) -> dict[str, Any] | None:
    """Hold a running run's schedule for one fold pass and return its state; None while another live pass
    holds it, or once the run has ended."""
    free = or_(SCHEDULES.c.claim_owner.is_(None), SCHEDULES.c.claimed_at < stale_before)
    running = select(RUNS.c.id).where(RUNS.c.id == run_id, RUNS.c.state == "running").exists()
    # Core statements on the tables, not ORM sessions: a fold pass makes several of these writes, and the
    # ORM's per-statement work was a large share of a pass on small models.
    with store.engine.begin() as connection:
        found = connection.execute(
            update(SCHEDULES)
            .where(SCHEDULES.c.run_id == run_id, free, running)
            .values(claim_owner=owner, claimed_at=time.time())
            .returning(SCHEDULES.c.state)
        ).first()
    return None if found is None else dict(found[0])


def _held(run_id: str, owner: str) -> Any:
    return and_(SCHEDULES.c.run_id == run_id, SCHEDULES.c.claim_owner == owner)


@retry_transient
def renew_schedule(store: Store, run_id: str, owner: str) -> bool:
    with store.engine.begin() as connection:
        result = connection.execute(update(SCHEDULES).where(_held(run_id, owner)).values(claimed_at=time.time()))
    return changed_one(result)


@retry_transient
def release_schedule(store: Store, run_id: str, owner: str) -> None:
    with store.engine.begin() as connection:
        connection.execute(update(SCHEDULES).where(_held(run_id, owner)).values(claim_owner=None, claimed_at=None))


class _ClaimTaken(Exception):
    """The schedule's claim went to another pass: nothing of this one's save is kept."""


@retry_transient
def save_pass(
    store: Store,
    run_id: str,
    owner: str,
    state: dict[str, Any],
    version: int,
    fates: Sequence[dict[str, Any]],
    selected: dict[int, list[int]],
    needed_from: int = 0,
    made: Sequence[MadeVersion] = (),
) -> bool:
    """Write what a fold pass reached, in one transaction: the versions it made, the schedule, the fates
    of the updates it took, the devices it sent off, by round, and which kept versions go (those before
    `needed_from`). False when its claim was taken over (nothing is written but state files no row names)."""
    # Files first, outside the transaction: a 45 MB write never holds the database's write lock.
    made = [
        replace(made_version, data=row_bytes(store, run_id, made_version.sha256, made_version.data))
        for made_version in made
    ]
    replaced: set[str] = set()
    try:
        with store.engine.begin() as connection:
            result = connection.execute(
                update(SCHEDULES)
                .where(_held(run_id, owner))
                .values(state=state, version=version, updated_at=time.time(), claimed_at=time.time())
            )
            if not changed_one(result):
                raise _ClaimTaken()
            for made_version in made:  # first: the rounds that train on them are extended below
                _record_version(connection, store, run_id, made_version)
            if made:
                replaced |= _checkpoint(connection, run_id, made[-1])
            if fates:
                connection.execute(_FATE_UPDATE, [_fate_params(run_id, fate) for fate in fates])
            for round_index, devices in selected.items():
                _extend(connection, run_id, round_index, devices)
            replaced |= _delete_versions_before(connection, run_id, needed_from)
            gone = unnamed(connection, run_id, replaced) if store.state_files is not None else set()
    except _ClaimTaken:
        return False
    remove_states(store, run_id, gone)
    return True


@retry_transient
def open_dispatches(
    store: Store, run_id: str, rounds: Sequence[RoundRow], selected: Mapping[int, Sequence[int]]
) -> None:
    """Before a pass sends devices off: the rounds they train in (new versions' ones) and their devices, so a
    worker finds each task it takes in the store (only work the scheduler sent is taken). Idempotent: the pass's
    save writes the same again, and a pass replayed after dying here sends the same trips."""
    with store.engine.begin() as connection:
        insert = dialect_insert(connection.dialect)
        for row in rounds:
            connection.execute(
                insert(ROUNDS)
                .values(_set_columns(row))
                .on_conflict_do_nothing(index_elements=["run_id", "round_index"])
            )
        for round_index, devices in selected.items():
            _extend(connection, run_id, round_index, devices)


@retry_transient
def stored_results(store: Store, run_id: str, rounds: Iterable[int], devices: Iterable[int]) -> list[Row[Any]]:
    """Stored results of these rounds and devices (a superset of the trips asked about): light rows."""
    wanted, among = sorted(set(rounds)), sorted(set(devices))
    if not wanted or not among:
        return []
    query = select(DeviceTaskRow.round_index, *OUTCOME_COLUMNS).where(
        DeviceTaskRow.run_id == run_id, DeviceTaskRow.round_index.in_(wanted), DeviceTaskRow.device.in_(among)
    )
    with store.engine.connect() as connection:
        return list(connection.execute(query))


@retry_transient
def untaken_update_keys(store: Store, run_id: str) -> list[str]:
    """Update blobs of results no fold pass took (stored after the run's last version, or as it ended)."""
    query = select(DeviceTaskRow.update_key).where(
        DeviceTaskRow.run_id == run_id, DeviceTaskRow.fate.is_(None), DeviceTaskRow.update_key.is_not(None)
    )
    with store.engine.connect() as connection:
        return [key for (key,) in connection.execute(query) if key is not None]


_FATE_UPDATE = (
    update(DeviceTaskRow)
    .where(
        DeviceTaskRow.run_id == bindparam("run"),
        DeviceTaskRow.round_index == bindparam("round"),
        DeviceTaskRow.device == bindparam("dev"),
    )
    .values({name: bindparam(name) for name in FATE_FIELDS})
)


def _fate_params(run_id: str, fate: dict[str, Any]) -> dict[str, Any]:
    """An update's fate (`round_index`, `device` and the FATE_FIELDS) as the bound values of _FATE_UPDATE."""
    return {"run": run_id, "round": fate["round_index"], "dev": fate["device"], **{n: fate[n] for n in FATE_FIELDS}}


def _set_columns(row: RoundRow) -> dict[str, Any]:
    """The columns given on a new ORM row, for a Core insert (those left out keep their defaults)."""
    return {column.key: getattr(row, column.key) for column in ROUNDS.columns if column.key in vars(row)}


def _extend(connection: Connection, run_id: str, round_index: int, devices: Sequence[int]) -> None:
    this_round = and_(ROUNDS.c.run_id == run_id, ROUNDS.c.round_index == round_index)
    selected = connection.execute(select(ROUNDS.c.selected).where(this_round)).scalar_one()
    connection.execute(update(ROUNDS).where(this_round).values(selected=sorted(set(selected) | set(devices))))


@retry_transient
def extend_selected(store: Store, run_id: str, round_index: int, devices: Sequence[int]) -> None:
    """Add devices sent out on the round's version to its `selected` list (kept sorted, each once)."""
    with store.engine.begin() as connection:
        _extend(connection, run_id, round_index, devices)


@retry_transient
def keep_version(store: Store, run_id: str, version: int, sha256: str, data: bytes) -> None:
    """Keep a version while it is needed (idempotent: a replayed pass writes the same bytes)."""
    kept = row_bytes(store, run_id, sha256, data)
    with store.session() as session, session.begin():
        session.merge(ModelVersionRow(run_id=run_id, version=version, sha256=sha256, data=kept))


@retry_transient
def kept_version(store: Store, run_id: str, version: int) -> ModelVersionRow | None:
    """A kept version with its bytes (read from its state file where the row holds none); None once it went."""
    with store.session() as session:
        row = session.get(ModelVersionRow, (run_id, version))
    if row is None or row.data:
        return row
    data = state_bytes(store, run_id, row.sha256, row.data)
    if data is None:  # dropped since the row was read: as if it had been gone then
        return None
    return ModelVersionRow(run_id=run_id, version=version, sha256=row.sha256, data=data, server_state=row.server_state)


@retry_transient
def forget_versions_before(store: Store, run_id: str, version: int) -> None:
    """Versions older than `version` are never read again: no device trains on them, no buffered update came from them."""
    with store.engine.begin() as connection:
        dropped = _delete_versions_before(connection, run_id, version)
        gone = unnamed(connection, run_id, dropped) if store.state_files is not None else set()
    remove_states(store, run_id, gone)


def _delete_versions_before(connection: Connection, run_id: str, version: int) -> set[str]:
    """Drop the kept versions before `version`; a checkpoint that names one of them takes its bytes first.
    The dropped versions' sha256s (their state files go once nothing names them)."""
    kept_bytes = (
        select(VERSIONS.c.data)
        .where(VERSIONS.c.run_id == run_id, VERSIONS.c.version == CHECKPOINTS.c.version)
        .scalar_subquery()
    )
    connection.execute(
        update(CHECKPOINTS)
        .where(
            CHECKPOINTS.c.run_id == run_id,
            CHECKPOINTS.c.version < version,
            func.length(CHECKPOINTS.c.data) == 0,
        )
        .values(data=func.coalesce(kept_bytes, CHECKPOINTS.c.data))  # none: its bytes are in its state file
    )
    dropped = connection.execute(
        delete(VERSIONS).where(VERSIONS.c.run_id == run_id, VERSIONS.c.version < version).returning(VERSIONS.c.sha256)
    )
    return set(dropped.scalars())


@dataclass(frozen=True)
class MadeVersion:
    """What a fold pass writes for a version it made (see save_pass)."""

    version: int
    sha256: str
    data: bytes | memoryview  # bytes once save_pass has put them in their file (or its row holds them)
    metrics: dict[str, Any]
    next_round: RoundRow | None  # the round that trains on it; None for the run's last version
    timing: TaskTiming | None = None
    server_state: bytes | None = None


def _record_version(connection: Connection, store: Store, run_id: str, made: MadeVersion) -> None:
    """Its round closed with its metrics, the pass's timing, and (unless it is the last) the version kept
    while needed, with the server's state after it, and the round that trains on it. Idempotent: a
    replayed pass writes the same rows (an upsert each, one statement where a look first took two)."""
    if made.timing is not None:
        connection.execute(store.timing_upsert, asdict(made.timing))
    connection.execute(
        update(ROUNDS)
        .where(ROUNDS.c.run_id == run_id, ROUNDS.c.round_index == made.version)
        .values(state="done", aggregated_at=time.time(), **made.metrics)
    )
    if made.next_round is None:
        return
    insert = dialect_insert(connection.dialect)
    version = insert(VERSIONS).values(
        run_id=run_id, version=made.version, sha256=made.sha256, data=made.data, server_state=made.server_state
    )
    replaced = taking_new(version, ("sha256", "data", "server_state"))
    connection.execute(version.on_conflict_do_update(index_elements=["run_id", "version"], set_=replaced))
    connection.execute(
        insert(ROUNDS)
        .values(_set_columns(made.next_round))
        .on_conflict_do_nothing(index_elements=["run_id", "round_index"])
    )


def _checkpoint(connection: Connection, run_id: str, made: MadeVersion) -> set[str]:
    """The run's checkpoint: the newest version a pass made (one row per run). A version kept for the run
    (all but its last) is not written twice: the checkpoint names it (load_checkpoint reads its bytes).
    The sha256 of the checkpoint it replaced, if another (its state file goes once nothing names it)."""
    before = connection.execute(select(CHECKPOINTS.c.sha256).where(CHECKPOINTS.c.run_id == run_id)).scalars()
    replaced = set(before) - {made.sha256}
    data = made.data if made.next_round is None else IN_KEPT_VERSION
    latest = dialect_insert(connection.dialect)(CHECKPOINTS).values(
        run_id=run_id, version=made.version, sha256=made.sha256, data=data
    )
    connection.execute(
        latest.on_conflict_do_update(index_elements=["run_id"], set_=taking_new(latest, ("version", "sha256", "data")))
    )
    return replaced
