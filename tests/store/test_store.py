"""The SQL store on real backends: every test runs once on SQLite and once on Postgres (`database_url`).

The Postgres database is shared by the whole test session, so each test works under its own run ids.
"""

from __future__ import annotations

import hashlib
import multiprocessing
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import Column, Integer, MetaData, func, inspect, select

from fedqueue.core.database import open_store
from fedqueue.core.jobs import schema_branches
from fedqueue.errors import ConfigError, NotFound, ServiceUnavailable
from fedqueue.fl.messages import device_task_name
from fedqueue.fl.store.results import (
    DeviceResult,
    add_round,
    claim_round,
    complete_round,
    count_done,
    delete_result,
    device_tasks,
    get_round,
    has_result,
    list_rounds,
    load_checkpoint,
    record_device_result,
    record_device_results,
    renew_claim,
    save_checkpoint,
    unclaim_round,
)
from fedqueue.fl.store.schema import CheckpointRow, RoundRow
from fedqueue.llm import schema as llm_schema
from fedqueue.store import Store
from fedqueue.store.db import SQLITE_PAGE_SIZE, WAL_CHECKPOINT_BYTES, make_engine
from fedqueue.store.migrate import branches_with_core, head_revision, schema_revision
from fedqueue.store.repo import TaskTiming
from fedqueue.store.schema import Base

TABLES = {"runs", "rounds", "task_timings", "device_tasks", "checkpoints"}


def new_run(store: Store, rounds_total: int = 3, **config: object) -> str:
    run_id = uuid.uuid4().hex  # 32 characters: the width of runs.id
    store.create_run(run_id, f"name-{run_id[:6]}", {"dataset": "digits", **config}, rounds_total, kind="fl")
    return run_id


def round_row(run_id: str, round_index: int, state: str = "training", selected: list[int] | None = None) -> RoundRow:
    return RoundRow(
        run_id=run_id,
        round_index=round_index,
        version=round_index - 1,
        state=state,
        selected=[3, 1, 2] if selected is None else selected,
        model_key=f"{run_id}/model/{round_index}",
        model_sha256="a" * 64,
        model_nbytes=100 + round_index,
        enqueued_at=time.time(),
    )


def device_result(
    run_id: str, round_index: int, device: int, worker: str = "w1", **overrides: object
) -> tuple[DeviceResult, TaskTiming]:
    """A device's result and its timing, as a worker stores them; overrides go to whichever has the field."""
    now = time.time()
    result = DeviceResult(
        run_id=run_id,
        round_index=round_index,
        device=device,
        state="done",
        worker=worker,
        attempt=1,
        samples=10 + device,
        loss=0.5 + device,
        # One key per delivery, as workers make them: the key tells a retry of this delivery from another one.
        update_key=f"{run_id}/update/{round_index}/{device}/{worker}",
        update_sha256="b" * 64,
        update_nbytes=64,
    )
    timing = TaskTiming(
        run_id=run_id,
        kind="fl",
        task_type="train",
        task=device_task_name(round_index, device),
        round_index=round_index,
        state="done",
        worker=worker,
        pid=1234,
        device_used="cpu",
        attempt=1,
        enqueued_at=now,
        started_at=now + 0.1,
        finished_at=now + 0.5,
        load_ms=1.5,
        compute_ms=20.25,
        upload_ms=2.0,
    )
    mine = {name: value for name, value in overrides.items() if name in DeviceResult.__dataclass_fields__}
    timed = {name: value for name, value in overrides.items() if name in TaskTiming.__dataclass_fields__}
    return replace(result, **mine), replace(timing, **timed)  # type: ignore[arg-type]


def branch_revisions(store: Store) -> dict[str, str | None]:
    """Where the core's and each installed kind's tables stand, by branch."""
    with store.engine.connect() as connection:
        return {branch.name: schema_revision(connection, branch) for branch in branches_with_core(schema_branches())}


def branch_heads() -> dict[str, str]:
    return {branch.name: head_revision(branch) for branch in branches_with_core(schema_branches())}


def not_a_version_table(name: str | None, type_: str, _parent: object) -> bool:
    """Each schema branch records its revision in a table of its own, which no model declares."""
    return not (type_ == "table" and name is not None and name.startswith("alembic_version"))


# schema and migrations


def test_migrate_creates_the_tables_at_head(database_url: str) -> None:
    """`open_store(migrate=True)` creates every table and records the newest revision of the core's branch and of
    each kind's, each in its own version table."""
    store = open_store(database_url, migrate=True)
    try:
        with store.engine.connect() as connection:
            names = set(inspect(connection).get_table_names())
        assert names >= TABLES | {"alembic_version", "alembic_version_fl", "alembic_version_llm"}
        assert branch_revisions(store) == branch_heads()
        assert {"core", "fl", "llm"} <= branch_heads().keys()
    finally:
        store.close()


def test_migrating_twice_is_harmless_and_keeps_data(database_url: str) -> None:
    """A second migrate on an up-to-date schema changes nothing and loses no row."""
    first = open_store(database_url, migrate=True)
    run_id = new_run(first)
    first.close()
    second = open_store(database_url, migrate=True)
    try:
        assert second.get_run(run_id).id == run_id
        assert branch_revisions(second) == branch_heads()
    finally:
        second.close()


def test_a_new_sqlite_store_has_big_pages_and_an_old_one_keeps_its_own(tmp_path: Path) -> None:
    """A new SQLite file is made with 64 KiB pages (a model's checkpoint writes faster); a file made before with
    the default pages is opened as it is, its data intact."""
    import sqlite3

    new = tmp_path / "new.db"
    open_store(f"sqlite:///{new}", migrate=True).engine.dispose()
    old = tmp_path / "old.db"
    with sqlite3.connect(old) as made:
        made.execute("PRAGMA journal_mode=WAL")
        made.execute("CREATE TABLE kept (value TEXT)")
        made.execute("INSERT INTO kept VALUES ('before')")
    store = open_store(f"sqlite:///{old}", migrate=True)
    with store.engine.connect() as connection:
        assert connection.exec_driver_sql("SELECT value FROM kept").scalar() == "before"
    store.engine.dispose()
    sizes = {}
    for path in (new, old):
        with sqlite3.connect(path) as reading:
            sizes[path.name] = reading.execute("PRAGMA page_size").fetchone()[0]
    assert sizes == {"new.db": SQLITE_PAGE_SIZE, "old.db": 4096}


def test_a_big_page_stores_wal_is_folded_back_at_the_same_bytes_as_small_pages(tmp_path: Path) -> None:
    """Small commits into a store of 64 KiB pages: the WAL beside it stays near WAL_CHECKPOINT_BYTES (SQLite's
    default, counted in pages, would let it reach 64 MB and fill a small disk by itself)."""
    path = tmp_path / "small.db"
    store = open_store(f"sqlite:///{path}", migrate=True)
    commits = 2 * WAL_CHECKPOINT_BYTES // SQLITE_PAGE_SIZE + 20  # each commit writes at least one whole page
    try:
        with store.engine.begin() as connection:
            connection.exec_driver_sql("CREATE TABLE scratch (value INTEGER)")
        for value in range(commits):
            with store.engine.begin() as connection:
                connection.exec_driver_sql(f"INSERT INTO scratch VALUES ({value})")
        wal_bytes = Path(f"{path}-wal").stat().st_size
    finally:
        store.engine.dispose()
    assert wal_bytes < WAL_CHECKPOINT_BYTES + 8 * SQLITE_PAGE_SIZE, wal_bytes


def test_deleting_a_big_row_does_not_write_its_pages_again(tmp_path: Path) -> None:
    """A replaced checkpoint or dropped version is freed, not zeroed (some SQLite builds zero it, writing its bytes
    once more through the WAL): the delete's commit writes a few pages, not the row's."""
    path = tmp_path / "big.db"
    store = open_store(f"sqlite:///{path}", migrate=True)
    row_pages = 24  # under the WAL's fold-back size: the insert's pages stay in the WAL until folded by hand
    try:
        with store.engine.begin() as connection:
            connection.exec_driver_sql("CREATE TABLE scratch (value BLOB)")
            connection.exec_driver_sql("INSERT INTO scratch VALUES (?)", (bytes(row_pages * SQLITE_PAGE_SIZE),))
        with store.engine.connect() as connection:
            connection.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")
        assert Path(f"{path}-wal").stat().st_size == 0
        with store.engine.begin() as connection:
            connection.exec_driver_sql("DELETE FROM scratch")
        wal_bytes = Path(f"{path}-wal").stat().st_size
    finally:
        store.engine.dispose()
    assert wal_bytes < 4 * SQLITE_PAGE_SIZE, wal_bytes


def test_a_read_cut_short_does_not_shut_its_connection_out_of_writes(tmp_path: Path) -> None:
    """A read cut short (its cursor still held, as the traceback of a Ctrl-C holds it) keeps its snapshot on the
    pooled connection; once another connection writes, a write there is refused at once as "database is locked",
    however long the busy timeout. The store replaces that connection: the write goes through."""
    path = tmp_path / "cut.db"
    store = open_store(f"sqlite:///{path}", migrate=True)
    other = open_store(f"sqlite:///{path}")
    try:
        run_ids = [new_run(store) for _ in range(3)]
        with store.engine.connect() as connection:
            cut_short = connection.exec_driver_sql("SELECT id FROM runs")
            cut_short.fetchone()
        new_run(other)  # written after the cut-short read took its snapshot
        assert store.finish_run(run_ids[0], "cancelled", "cancelled with Ctrl-C")
        assert store.get_run(run_ids[0]).state == "cancelled"
    finally:
        store.engine.dispose()
        other.engine.dispose()


def test_open_without_migrate_on_empty_sqlite_is_refused(tmp_path: Path) -> None:
    """An empty database is reported as unavailable (no tables), not used as if it were a store."""
    with pytest.raises(ServiceUnavailable, match="no fedqueue tables"):
        open_store(f"sqlite:///{tmp_path / 'empty.db'}")


def test_open_without_migrate_after_migration_works(database_url: str) -> None:
    """Once migrated, a plain `open_store(url)` opens the same data."""
    migrated = open_store(database_url, migrate=True)
    run_id = new_run(migrated)
    migrated.close()
    plain = open_store(database_url)
    try:
        assert plain.get_run(run_id).id == run_id
    finally:
        plain.close()


def test_alembic_migration_matches_orm_schema(store: Store) -> None:
    """Autogenerate finds no difference between the migrated database and `Base.metadata`: the core's tables and
    those the job kinds declare on it (FL's, and the LLM kind's prompts)."""
    assert {"rounds", llm_schema.LlmPromptRow.__tablename__} <= Base.metadata.tables.keys()
    with store.engine.connect() as connection:
        context = MigrationContext.configure(
            connection, opts={"compare_type": True, "include_name": not_a_version_table}
        )
        diff = compare_metadata(context, Base.metadata)
    assert diff == []


def test_schema_comparison_is_not_vacuous(store: Store) -> None:
    """The same comparison does report a model that differs from the database (an extra column)."""
    changed = MetaData()
    for table in Base.metadata.tables.values():
        table.to_metadata(changed)
    changed.tables["runs"].append_column(Column("priority", Integer, nullable=True))
    with store.engine.connect() as connection:
        options = {"compare_type": True, "include_name": not_a_version_table}
        diff = compare_metadata(MigrationContext.configure(connection, opts=options), changed)
    assert [(entry[0], entry[2], entry[3].name) for entry in diff] == [("add_column", "runs", "priority")]


# runs


def test_create_get_list_and_finish_runs(store: Store) -> None:
    """A run is stored as running with its config; finishing sets the state, the error and finished_at."""
    first = new_run(store, rounds_total=4, lr=0.1, nested={"a": [1, 2]})
    time.sleep(0.01)
    second = new_run(store, rounds_total=2)
    row = store.get_run(first)
    assert row.state == "running" and row.finished_at is None and row.error is None
    assert row.rounds_total == 4
    assert row.name == f"name-{first[:6]}"
    assert row.config == {"dataset": "digits", "lr": 0.1, "nested": {"a": [1, 2]}}

    listed = [run.id for run in store.list_runs() if run.id in {first, second}]
    assert listed == [first, second]  # oldest first

    store.finish_run(first, "finished")
    store.finish_run(second, "failed", error="boom")
    done, failed = store.get_run(first), store.get_run(second)
    assert done.state == "finished" and done.error is None
    assert done.finished_at is not None and done.finished_at >= done.created_at
    assert failed.state == "failed" and failed.error == "boom" and failed.finished_at is not None


def test_get_unknown_run_raises_not_found_naming_the_id(store: Store) -> None:
    """An unknown run id raises NotFound whose message names that id."""
    missing = uuid.uuid4().hex
    with pytest.raises(NotFound) as caught:
        store.get_run(missing)
    assert missing in str(caught.value)


# rounds


def test_rounds_listed_in_index_order(store: Store) -> None:
    """Rounds added out of order are listed by round index; get_round finds one or returns None."""
    run_id = new_run(store)
    other = new_run(store)
    for index in (3, 1, 2):
        add_round(store, round_row(run_id, index))
    add_round(store, round_row(other, 1))
    assert [row.round_index for row in list_rounds(store, run_id)] == [1, 2, 3]
    got = get_round(store, run_id, 2)
    assert got is not None and got.run_id == run_id and got.round_index == 2
    assert got.selected == [3, 1, 2] and got.model_nbytes == 102 and got.state == "training"
    assert get_round(store, run_id, 9) is None
    assert [row.round_index for row in list_rounds(store, other)] == [1]


def test_second_round_row_with_same_index_is_refused(store: Store) -> None:
    """Two starters of one round: the unique (run_id, round_index) lets the first record it, the second learns so."""
    run_id = new_run(store)
    assert add_round(store, round_row(run_id, 1)) is True
    assert add_round(store, round_row(run_id, 1, state="done")) is False
    rows = list_rounds(store, run_id)
    assert len(rows) == 1 and rows[0].state == "training"


def test_round_starters_racing_from_threads_record_it_once(store: Store) -> None:
    """Eight threads starting the same round at once: one True, no exception, one row."""
    run_id = new_run(store)
    barrier = threading.Barrier(8)

    def start() -> bool:
        barrier.wait(timeout=30)
        return add_round(store, round_row(run_id, 1))

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda _: start(), range(8)))
    assert sorted(results) == [False] * 7 + [True]
    assert len(list_rounds(store, run_id)) == 1


def test_claim_round_exactly_one_caller_wins(store: Store) -> None:
    """Of several claims of a training round only the first returns True; the round is then aggregating."""
    run_id = new_run(store)
    add_round(store, round_row(run_id, 1))
    add_round(store, round_row(run_id, 2, state="done"))
    stale_before = time.time() - 60
    results = [claim_round(store, run_id, 1, f"agg{n}", stale_before) for n in range(5)]
    assert results == [True, False, False, False, False]
    claimed = get_round(store, run_id, 1)
    assert claimed is not None and claimed.state == "aggregating" and claimed.claim_owner == "agg0"
    assert claim_round(store, run_id, 2, "agg9", stale_before) is False  # not training: nothing to claim
    assert claim_round(store, run_id, 7, "agg9", stale_before) is False  # no such round


def test_a_renewed_claim_is_never_taken_over_and_a_stale_one_is(store: Store) -> None:
    """Takeover needs a claim older than the cut-off; renewal keeps it young; the loser can no longer renew or close."""
    run_id = new_run(store)
    add_round(store, round_row(run_id, 1))
    assert claim_round(store, run_id, 1, "first", stale_before=time.time() - 60)
    assert renew_claim(store, run_id, 1, "first") is True
    # Renewed just now: a cut-off in the past does not make it stale.
    assert claim_round(store, run_id, 1, "second", stale_before=time.time() - 5) is False
    # Not renewed since before the cut-off: taken over.
    assert claim_round(store, run_id, 1, "second", stale_before=time.time() + 1) is True
    assert renew_claim(store, run_id, 1, "first") is False
    assert complete_round(store, run_id, 1, "first") is False
    unclaim_round(store, run_id, 1, "first")  # not its claim any more: nothing happens
    row = get_round(store, run_id, 1)
    assert row is not None and row.state == "aggregating" and row.claim_owner == "second"
    assert complete_round(store, run_id, 1, "second", accuracy=0.5) is True
    row = get_round(store, run_id, 1)
    assert row is not None and row.state == "done" and row.accuracy == 0.5


def test_unclaim_hands_the_round_back_for_a_retry(store: Store) -> None:
    run_id = new_run(store)
    add_round(store, round_row(run_id, 1))
    assert claim_round(store, run_id, 1, "first", stale_before=time.time() - 60)
    unclaim_round(store, run_id, 1, "first")
    row = get_round(store, run_id, 1)
    assert row is not None and row.state == "training" and row.claim_owner is None
    assert claim_round(store, run_id, 1, "retry", stale_before=time.time() - 60)


def test_finish_run_never_overwrites_an_ended_run(store: Store) -> None:
    """A run failed by its aggregation stays failed when a late finisher comes along."""
    run_id = new_run(store)
    assert store.finish_run(run_id, "failed", "round 1: aggregation failed") is True
    assert store.finish_run(run_id, "finished") is False
    run = store.get_run(run_id)
    assert run.state == "failed" and run.error == "round 1: aggregation failed"


def test_a_retry_after_a_lost_commit_acknowledgement_knows_the_row_is_its_own(store: Store) -> None:
    """The same delivery stored twice (its first commit's reply was lost) is told "stored by you", with the count.

    Another delivery of the device is told None, so only it deletes its blob: the stored row's blob stays.
    """
    run_id = new_run(store)
    add_round(store, round_row(run_id, 1))
    mine = device_result(run_id, 1, 3, worker="first")
    assert record_device_result(store, *mine) == 1
    assert record_device_result(store, *mine) == 1  # the retry: same update key, counted once
    assert record_device_result(store, *device_result(run_id, 1, 1, worker="first")) == 2
    assert record_device_result(store, *device_result(run_id, 1, 3, worker="second")) is None
    row = get_round(store, run_id, 1)
    assert row is not None and row.stored == 2
    assert [task.update_key for task in device_tasks(store, run_id, 1) if task.device == 3] == [mine[0].update_key]


def test_claim_round_from_many_threads_has_one_winner(store: Store) -> None:
    """Eight threads claiming the same round at once: exactly one wins."""
    run_id = new_run(store)
    add_round(store, round_row(run_id, 1))
    threads = 8
    barrier = threading.Barrier(threads)

    def claim() -> bool:
        barrier.wait(timeout=30)
        return claim_round(store, run_id, 1, threading.current_thread().name, time.time() - 60)

    with ThreadPoolExecutor(threads) as pool:
        results = list(pool.map(lambda _: claim(), range(threads)))
    assert sorted(results) == [False] * (threads - 1) + [True]


# device results


def test_record_device_result_stores_once_keeping_first(store: Store) -> None:
    """A repeated (run, round, device) is not stored again and does not overwrite the first row."""
    run_id = new_run(store)
    add_round(store, round_row(run_id, 1, selected=list(range(100))))
    assert not has_result(store, run_id, 1, 4)
    assert record_device_result(store, *device_result(run_id, 1, 4, worker="first", loss=0.25)) == 1
    assert record_device_result(store, *device_result(run_id, 1, 4, worker="second", loss=9.0, pid=99)) is None
    assert has_result(store, run_id, 1, 4)
    assert not has_result(store, run_id, 1, 5)
    assert not has_result(store, run_id, 2, 4)
    assert count_done(store, run_id, 1) == 1
    (row,) = device_tasks(store, run_id, 1)
    assert (row.worker, row.loss) == ("first", 0.25)
    (timing,) = store.task_timings(run_id, 1)
    assert (timing.worker, timing.pid) == ("first", 1234)  # the duplicate's timing (pid 99) was not stored


def test_results_sharing_a_summed_update_are_stored_all_or_none(store: Store) -> None:
    """A vmapped pack's rows share one pre-summed update: one device stored before stores none of them."""
    run_id = new_run(store)
    add_round(store, round_row(run_id, 1, selected=[4, 5, 6]))
    assert record_device_result(store, *device_result(run_id, 1, 5, worker="alone")) == 1
    shared = {"update_key": f"{run_id}/update/1/pack-4-6/w2", "worker": "w2"}
    pack = [device_result(run_id, 1, device, **shared) for device in (4, 5, 6)]
    assert record_device_results(store, pack, all_or_nothing=True) == [None, None, None]
    assert [row.device for row in device_tasks(store, run_id, 1)] == [5]
    assert len(store.task_timings(run_id, 1)) == 1
    # Without device 5 in it, the pack is stored whole, and a retry of the same delivery finds its rows.
    rest = [device_result(run_id, 1, device, **shared) for device in (4, 6)]
    assert record_device_results(store, rest, all_or_nothing=True) == [2, 3]
    assert record_device_results(store, rest, all_or_nothing=True) == [3, 3]
    assert {row.device: row.update_key for row in device_tasks(store, run_id, 1)} == {
        4: shared["update_key"],
        5: f"{run_id}/update/1/5/alone",
        6: shared["update_key"],
    }


def test_a_task_timing_is_its_latest_delivery_and_every_kind_shares_the_table(store: Store) -> None:
    """A retried task (an aggregation that failed, then ran) keeps one timing row: the later one.

    Other kinds' tasks, with no round, sit in the same table and come back in start order.
    """
    run_id = new_run(store)
    _, timing = device_result(run_id, 1, 0)
    failed = replace(timing, task_type="aggregate", task="round 1 aggregation", state="failed", error="boom")
    store.record_timing(failed)
    store.record_timing(replace(failed, state="done", attempt=2, error=None, started_at=timing.started_at + 1))
    store.record_timing(replace(timing, kind="llm", task_type="generate", task="batch 4", round_index=None))
    rows = store.task_timings(run_id)
    assert [(row.task, row.kind, row.state, row.attempt, row.error) for row in rows] == [
        ("batch 4", "llm", "done", 1, None),
        ("round 1 aggregation", "fl", "done", 2, None),
    ]
    assert [row.task for row in store.task_timings(run_id, 1)] == ["round 1 aggregation"]


def test_device_tasks_ordered_and_counted(store: Store) -> None:
    """device_tasks lists by round then device; count_done counts one round's rows."""
    run_id = new_run(store)
    for round_index in (1, 2):
        add_round(store, round_row(run_id, round_index, selected=list(range(100))))
    for round_index, device in [(2, 7), (1, 5), (1, 1), (2, 0), (1, 3)]:
        assert record_device_result(store, *device_result(run_id, round_index, device))
    assert [row.device for row in device_tasks(store, run_id, 1)] == [1, 3, 5]
    assert [row.device for row in device_tasks(store, run_id, 2)] == [0, 7]
    assert [(row.round_index, row.device) for row in device_tasks(store, run_id)] == [
        (1, 1),
        (1, 3),
        (1, 5),
        (2, 0),
        (2, 7),
    ]
    assert count_done(store, run_id, 1) == 3
    assert count_done(store, run_id, 2) == 2
    assert count_done(store, run_id, 3) == 0
    stored = device_tasks(store, run_id, 1)[0]
    expected, expected_timing = device_result(run_id, 1, 1)
    assert stored.samples == expected.samples and stored.update_key == expected.update_key
    assert stored.state == "done"
    timing = next(row for row in store.task_timings(run_id) if row.task == expected_timing.task)
    assert (timing.compute_ms, timing.kind, timing.task_type) == (expected_timing.compute_ms, "fl", "train")
    assert len(store.task_timings(run_id)) == 5 and len(store.task_timings(run_id, 2)) == 2


def test_a_result_its_round_never_sent_out_is_refused_and_not_counted(store: Store) -> None:
    """Only work the scheduler sent is taken: a device outside the round's selection, or a round never started."""
    run_id = new_run(store)
    add_round(store, round_row(run_id, 1, selected=[1, 3]))
    assert record_device_result(store, *device_result(run_id, 1, 2)) is None  # not selected
    assert record_device_result(store, *device_result(run_id, 2, 1)) is None  # no such round
    pack = [device_result(run_id, 1, device, update_key=f"{run_id}/update/1/pack-1-2/x") for device in (1, 2)]
    assert record_device_results(store, pack, all_or_nothing=True) == [None, None]
    row = get_round(store, run_id, 1)
    assert device_tasks(store, run_id) == [] and row is not None and row.stored == 0
    assert record_device_result(store, *device_result(run_id, 1, 3)) == 1


def test_concurrent_threads_lose_no_result(store: Store) -> None:
    """Eight threads recording distinct devices at once: every row arrives, none raises."""
    run_id = new_run(store)
    add_round(store, round_row(run_id, 1, selected=list(range(100))))
    threads, per_thread = 8, 10
    barrier = threading.Barrier(threads)

    def write(worker: int) -> list[int | None]:
        barrier.wait(timeout=30)
        return [
            record_device_result(store, *device_result(run_id, 1, worker * per_thread + i, worker=f"t{worker}"))
            for i in range(per_thread)
        ]

    with ThreadPoolExecutor(threads) as pool:
        outcomes = list(pool.map(write, range(threads)))
    assert all(None not in stored for stored in outcomes)  # None: a result refused
    assert count_done(store, run_id, 1) == threads * per_thread
    assert [row.device for row in device_tasks(store, run_id, 1)] == list(range(threads * per_thread))


def _record_in_child(url: str, run_id: str, worker: int, per_worker: int, start_at: float) -> int:
    """Runs in a spawned process: its own store, writing its own devices."""
    child = open_store(url)
    try:
        time.sleep(max(0.0, start_at - time.time()))
        stored = 0
        for i in range(per_worker):
            stored += (
                record_device_result(child, *device_result(run_id, 1, worker * per_worker + i, worker=f"p{worker}"))
                is not None
            )
        return stored
    finally:
        child.close()


def test_concurrent_processes_lose_no_result(store: Store, database_url: str) -> None:
    """Four spawned processes, each with its own store, write distinct devices at once: no row lost."""
    run_id = new_run(store)
    add_round(store, round_row(run_id, 1, selected=list(range(100))))
    procs, per_worker = 4, 15
    context = multiprocessing.get_context("spawn")
    start_at = time.time() + 3.0  # spawned interpreters need a moment; they then start together
    with context.Pool(procs) as pool:
        stored = pool.starmap(
            _record_in_child, [(database_url, run_id, worker, per_worker, start_at) for worker in range(procs)]
        )
    assert stored == [per_worker] * procs
    assert count_done(store, run_id, 1) == procs * per_worker
    rows = device_tasks(store, run_id, 1)
    assert [row.device for row in rows] == list(range(procs * per_worker))
    assert {row.worker for row in rows} == {f"p{worker}" for worker in range(procs)}


def test_round_counts_its_stored_results_once_each(store: Store) -> None:
    """Each new result returns its round's new count; a repeat returns None; a deleted one is uncounted."""
    run_id = new_run(store)
    add_round(store, round_row(run_id, 1))
    add_round(store, round_row(run_id, 2))
    assert [record_device_result(store, *device_result(run_id, 1, device)) for device in (3, 1)] == [1, 2]
    assert record_device_result(store, *device_result(run_id, 1, 3, worker="again")) is None
    assert record_device_result(store, *device_result(run_id, 2, 3)) == 1  # rounds count apart
    delete_result(store, run_id, 1, 3)
    delete_result(store, run_id, 1, 3)  # a repeated delete uncounts nothing more
    assert record_device_result(store, *device_result(run_id, 1, 2, state="failed")) == 2
    row = get_round(store, run_id, 1)
    assert row is not None and row.stored == count_done(store, run_id, 1) == 2


def test_concurrent_threads_count_each_result_once(store: Store) -> None:
    """Eight threads storing one round's results at once: the counts returned are exactly 1..N."""
    run_id = new_run(store)
    add_round(store, round_row(run_id, 1, selected=list(range(100))))
    threads, per_thread = 8, 5
    barrier = threading.Barrier(threads)

    def write(worker: int) -> list[int | None]:
        barrier.wait(timeout=30)
        return [
            record_device_result(store, *device_result(run_id, 1, worker * per_thread + i)) for i in range(per_thread)
        ]

    with ThreadPoolExecutor(threads) as pool:
        counts = [count for outcome in pool.map(write, range(threads)) for count in outcome]
    assert sorted(c for c in counts if c is not None) == list(range(1, threads * per_thread + 1))


# checkpoints


def test_checkpoint_keeps_only_latest(store: Store) -> None:
    """Saving twice keeps one row, the latest; load returns its exact bytes and sha."""
    run_id = new_run(store)
    assert load_checkpoint(store, run_id) is None
    old, new = b"\x00old\xff" * 10, bytes(range(256)) * 40
    save_checkpoint(store, run_id, 1, hashlib.sha256(old).hexdigest(), old)
    save_checkpoint(store, run_id, 2, hashlib.sha256(new).hexdigest(), new)
    loaded = load_checkpoint(store, run_id)
    assert loaded is not None
    assert loaded.version == 2 and bytes(loaded.data) == new
    assert loaded.sha256 == hashlib.sha256(new).hexdigest()
    with store.session() as session:
        count = session.scalar(select(func.count()).select_from(CheckpointRow).where(CheckpointRow.run_id == run_id))
    assert count == 1


# engines and failures


@pytest.mark.parametrize("url", ["mysql://u@h/db", "mongodb://h/db"])
def test_make_engine_refuses_unsupported_scheme(url: str) -> None:
    """Only sqlite and postgresql URLs are accepted."""
    with pytest.raises(ConfigError, match="unsupported"):
        make_engine(url)


def test_make_engine_refuses_a_non_url() -> None:
    """A string that is not a database URL is a ConfigError."""
    with pytest.raises(ConfigError, match="not a database URL"):
        make_engine("not a url at all")


def test_unreachable_postgres_fails_fast_without_password() -> None:
    """A Postgres that does not answer gives ServiceUnavailable within 10 s; the password is masked."""
    url = "postgresql://user:s3cret@127.0.0.1:1/x"
    started = time.monotonic()
    with pytest.raises(ServiceUnavailable) as caught:
        open_store(url)
    assert time.monotonic() - started < 10
    message = str(caught.value)
    assert "s3cret" not in message
    assert "unreachable" in message and "127.0.0.1" in message
