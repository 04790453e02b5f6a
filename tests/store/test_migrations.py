"""Schema upgrades: data kept, one transaction at a time, and read-only opens that never change the schema;
the core's and each job kind's tables on schema branches of their own, and databases from the earlier single
line of revisions (0001-0011) carried onto them.

Each test runs on SQLite and on a Postgres database of its own (it needs an empty or an old schema).
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from alembic import command
from alembic.config import Config
from sqlalchemy import JSON, bindparam, create_engine, event, inspect, text
from sqlalchemy.engine import Engine, make_url

from fedqueue.core.database import open_store
from fedqueue.core.jobs import schema_branches
from fedqueue.errors import ConfigError, ServiceUnavailable
from fedqueue.store import connect_store
from fedqueue.store.db import make_engine
from fedqueue.store.migrate import (
    CORE_BRANCH,
    LEGACY,
    MIGRATIONS,
    SchemaBranch,
    branches_with_core,
    head_revision,
    schema_revision,
)

OLD = "0004"
NEW_RUN_COLUMNS = {"kind", "broker_id"}
BIG = 5 * 2**31  # a byte size past 32 bits
WAIT_S = 60  # a guard against a hang, never a pause the test relies on


@contextmanager
def empty_database(database_url: str, sqlite_url: str) -> Iterator[str]:
    """An empty database: `sqlite_url` on SQLite, or a new Postgres database dropped afterwards."""
    if make_url(database_url).get_backend_name() == "sqlite":
        yield sqlite_url
        return
    admin = create_engine(database_url, isolation_level="AUTOCOMMIT")
    name = f"fedqueue_mig_{uuid.uuid4().hex[:10]}"
    with admin.connect() as connection:
        connection.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield make_url(database_url).set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as connection:
            connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@pytest.fixture
def fresh_url(database_url: str) -> Iterator[str]:
    """An empty database: the test's own SQLite file, or a new Postgres database."""
    with empty_database(database_url, database_url) as url:
        yield url


def on_engine(url: str, action: Callable[[Engine], Any]) -> Any:
    engine = make_engine(url)
    try:
        return action(engine)
    finally:
        engine.dispose()


def alembic_to(url: str, revision: str, step: Callable[[Config, str], None] = command.upgrade) -> None:
    """Upgrade (or downgrade) the database to `revision` of the earlier single line directly, as an older fedqueue
    would have."""

    def run(engine: Engine) -> None:
        with engine.begin() as connection:
            config = Config()
            config.set_main_option("script_location", str(MIGRATIONS))
            config.set_main_option("path_separator", "os")
            config.set_main_option("version_locations", str(LEGACY))
            config.attributes["connection"] = connection
            step(config, revision)

    on_engine(url, run)


def insert_old_rows(url: str) -> None:
    """Two runs, each with two rounds, two device tasks per round and a checkpoint, written at revision 0004."""
    config = {"dataset": "digits", "lr": 0.1}
    run_sql = text(
        "INSERT INTO runs (id, name, config, state, rounds_total, created_at, lease_owner)"
        " VALUES (:id, :name, :config, 'running', 2, 1.0, 'sched-1')"
    ).bindparams(bindparam("config", type_=JSON))
    round_sql = text(
        "INSERT INTO rounds (run_id, round_index, version, state, selected, model_key, model_sha256, model_nbytes,"
        " enqueued_at, stored) VALUES (:run, :round, :round - 1, 'done', :selected, 'k', :sha, :nbytes, 2.0, 2)"
    ).bindparams(bindparam("selected", type_=JSON))
    task_sql = text(
        "INSERT INTO device_tasks (run_id, round_index, device, state, worker, pid, device_used, attempt,"
        " enqueued_at, started_at, finished_at, load_ms, train_ms, upload_ms, samples, update_nbytes)"
        " VALUES (:run, :round, :device, 'done', 'w1', 1, 'cpu', 1, 2.0, 2.1, 2.5, 1.0, 2.0, 3.0, 10, :nbytes)"
    )
    checkpoint_sql = text("INSERT INTO checkpoints (run_id, version, sha256, data) VALUES (:run, 2, :sha, :data)")

    def insert(engine: Engine) -> None:
        with engine.begin() as connection:
            for run in ("run-a", "run-b"):
                connection.execute(run_sql, {"id": run, "name": f"name-{run}", "config": config})
                for round_index in (1, 2):
                    connection.execute(
                        round_sql,
                        {
                            "run": run,
                            "round": round_index,
                            "selected": [0, 1],
                            "sha": "a" * 64,
                            "nbytes": 1000 + round_index,
                        },
                    )
                    for device in (0, 1):
                        connection.execute(
                            task_sql, {"run": run, "round": round_index, "device": device, "nbytes": 64 + device}
                        )
                connection.execute(checkpoint_sql, {"run": run, "sha": "c" * 64, "data": b"model"})

    on_engine(url, insert)


def count(connection: Any, table: str) -> int:
    return connection.execute(text(f"SELECT COUNT(*) FROM {table}")).scalar_one()


def column_names(url: str, table: str) -> set[str]:
    def read(engine: Engine) -> set[str]:
        with engine.connect() as connection:
            return {column["name"] for column in inspect(connection).get_columns(table)}

    return on_engine(url, read)


def revision_of(url: str) -> str | None:
    return on_engine(url, schema_revision)


# upgrades keep data


def test_upgrade_from_0004_keeps_every_row_and_fills_the_new_columns(fresh_url: str) -> None:
    """Rows written at 0004 survive the upgrade (no cascade from a rebuilt `runs`); new columns get defaults."""
    alembic_to(fresh_url, OLD)
    insert_old_rows(fresh_url)
    store = open_store(fresh_url, migrate=True)
    try:
        with store.engine.begin() as connection:
            counts = {table: count(connection, table) for table in ("runs", "rounds", "device_tasks", "checkpoints")}
            runs = connection.execute(text("SELECT kind, broker_id, lease_owner FROM runs")).all()
            rounds = connection.execute(text("SELECT claim_owner, model_nbytes, stored FROM rounds")).all()
            connection.execute(text("UPDATE rounds SET model_nbytes = :big"), {"big": BIG})
            connection.execute(text("UPDATE device_tasks SET update_nbytes = :big"), {"big": BIG})
            timings = connection.execute(
                text(
                    "SELECT run_id, kind, task_type, task, round_index, worker, pid, attempt, started_at, compute_ms"
                    " FROM task_timings ORDER BY run_id, round_index, task"
                )
            ).all()
            timing_columns = {column["name"] for column in inspect(connection).get_columns("device_tasks")}
        with store.engine.connect() as connection:
            big = connection.execute(text("SELECT MIN(model_nbytes) FROM rounds")).scalar_one()
            big_update = connection.execute(text("SELECT MIN(update_nbytes) FROM device_tasks")).scalar_one()
    finally:
        store.close()
    assert counts == {"runs": 2, "rounds": 4, "device_tasks": 8, "checkpoints": 2}
    assert sorted(runs) == [("fl", None, "sched-1")] * 2
    assert sorted(rounds) == [(None, 1001, 2), (None, 1001, 2), (None, 1002, 2), (None, 1002, 2)]
    assert big == big_update == BIG
    # 0006 moved each device task's timing to the shared table and left device_tasks its results.
    assert timings == [
        (run, "fl", "train", f"round {r} device {d}", r, "w1", 1, 1, 2.1, 2.0)
        for run in ("run-a", "run-b")
        for r in (1, 2)
        for d in (0, 1)
    ]
    assert not {"pid", "started_at", "train_ms"} & timing_columns and {"worker", "attempt"} <= timing_columns
    assert revision_of(fresh_url) == head_revision()


def test_downgrade_to_0004_keeps_every_row(fresh_url: str) -> None:
    """The earlier line's downgrade drops only the new columns (no table rebuild), so no row goes with them."""
    alembic_to(fresh_url, OLD)
    insert_old_rows(fresh_url)
    alembic_to(fresh_url, "head")
    alembic_to(fresh_url, OLD, command.downgrade)

    def counts(engine: Engine) -> dict[str, int]:
        with engine.connect() as connection:
            return {table: count(connection, table) for table in ("runs", "rounds", "device_tasks", "checkpoints")}

    def timings(engine: Engine) -> list[Any]:
        with engine.connect() as connection:
            return list(connection.execute(text("SELECT DISTINCT pid, started_at, train_ms FROM device_tasks")))

    assert on_engine(fresh_url, counts) == {"runs": 2, "rounds": 4, "device_tasks": 8, "checkpoints": 2}
    assert on_engine(fresh_url, timings) == [(1, 2.1, 2.0)]  # the timings came back from task_timings
    assert not NEW_RUN_COLUMNS & column_names(fresh_url, "runs")
    assert "claim_owner" not in column_names(fresh_url, "rounds")
    assert revision_of(fresh_url) == OLD


# upgrades are atomic and serialised


@pytest.fixture
def paused_migration() -> Iterator[tuple[threading.Event, threading.Event]]:
    """Pause any migration right after its first new column is added, inside its transaction.

    Yields (paused, resume): `paused` is set once a migrator waits; setting `resume` lets it go on.
    """
    paused, resume = threading.Event(), threading.Event()

    def hold(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        if "add column kind" in statement.lower():
            paused.set()
            resume.wait(WAIT_S)

    event.listen(Engine, "after_cursor_execute", hold)
    try:
        yield paused, resume
    finally:
        resume.set()
        event.remove(Engine, "after_cursor_execute", hold)


def test_reader_during_a_migration_sees_the_old_schema_whole_never_half(
    fresh_url: str, paused_migration: tuple[threading.Event, threading.Event]
) -> None:
    """While a migration is half done, a read-only open is refused naming the old revision, and the old
    schema shows none of the upgrade's columns; once it commits, the new schema is there in full."""
    paused, resume = paused_migration
    alembic_to(fresh_url, OLD)
    insert_old_rows(fresh_url)
    with ThreadPoolExecutor(max_workers=2) as pool:
        migration = pool.submit(lambda: open_store(fresh_url, migrate=True).close())
        migration.add_done_callback(lambda _: paused.set())  # a migration that fails early is reported at once
        assert paused.wait(WAIT_S), "the migration never reached its first new column"
        assert not migration.done(), migration.result()
        reader = pool.submit(lambda: open_store(fresh_url).close())
        with pytest.raises(ServiceUnavailable) as refused:
            reader.result(timeout=WAIT_S)
        assert not NEW_RUN_COLUMNS & column_names(fresh_url, "runs")  # `kind` exists only in the open transaction
        assert revision_of(fresh_url) == OLD
        resume.set()
        migration.result(timeout=WAIT_S)
    assert f"revision {OLD}" in str(refused.value) and head_revision() in str(refused.value)

    store = open_store(fresh_url)
    try:
        with store.engine.connect() as connection:
            runs = connection.execute(text("SELECT kind, broker_id FROM runs")).all()
            owners = connection.execute(text("SELECT claim_owner FROM rounds")).scalars().all()
    finally:
        store.close()
    assert runs == [("fl", None)] * 2 and owners == [None] * 4


def test_concurrent_migrators_on_a_fresh_database_all_succeed(fresh_url: str) -> None:
    """Several processes starting at once on an empty database all open it; the schema ends at head."""
    migrators = 4
    start = threading.Barrier(migrators)

    def migrate() -> None:
        start.wait(WAIT_S)
        open_store(fresh_url, migrate=True).close()

    with ThreadPoolExecutor(max_workers=migrators) as pool:
        for future in [pool.submit(migrate) for _ in range(migrators)]:
            future.result(timeout=WAIT_S)
    assert revision_of(fresh_url) == head_revision()
    assert column_names(fresh_url, "runs") >= NEW_RUN_COLUMNS


# read-only opens


def test_read_only_open_of_an_empty_database_is_refused_and_creates_nothing(fresh_url: str) -> None:
    """`open_store(url)` on an empty database raises one line naming the problem, and writes no table."""
    with pytest.raises(ServiceUnavailable) as refused:
        open_store(fresh_url)
    message = str(refused.value)
    assert "no fedqueue tables" in message and "\n" not in message
    assert refused.value.exit_code == 2
    database = make_url(fresh_url).database or ""
    if make_url(fresh_url).get_backend_name() == "sqlite":
        assert not Path(database).exists()  # not even an empty file
    assert on_engine(fresh_url, lambda engine: inspect(engine).get_table_names()) == []


def test_read_only_open_of_an_old_schema_names_both_revisions_and_upgrades_nothing(fresh_url: str) -> None:
    """`open_store(url)` on a 0004 database says it is at 0004 and head is needed, and leaves it at 0004."""
    alembic_to(fresh_url, OLD)
    with pytest.raises(ServiceUnavailable) as refused:
        open_store(fresh_url)
    message = str(refused.value)
    assert f"revision {OLD}" in message and f"needs {head_revision()}" in message
    assert "fedqueue worker" in message and "\n" not in message
    assert revision_of(fresh_url) == OLD
    assert not NEW_RUN_COLUMNS & column_names(fresh_url, "runs")


def test_a_schema_newer_than_this_code_is_refused_by_readers_and_migrators(fresh_url: str) -> None:
    """A revision this fedqueue does not know (a newer fedqueue wrote it) is named, never upgraded over."""
    open_store(fresh_url, migrate=True).close()

    def stamp(engine: Engine) -> None:
        with engine.begin() as connection:
            connection.execute(text("UPDATE alembic_version SET version_num = '9999'"))

    on_engine(fresh_url, stamp)
    for migrate in (False, True):
        with pytest.raises(ServiceUnavailable, match="revision 9999 is newer than this fedqueue's"):
            open_store(fresh_url, migrate=migrate)
    assert revision_of(fresh_url) == "9999"


# schema branches: the core's and each kind's


def schema_shape(url: str) -> dict[str, Any]:
    """Every table's columns (type, nullability, server default), keys, indexes and unique constraints."""

    def read(engine: Engine) -> dict[str, Any]:
        found = inspect(engine)
        shape: dict[str, Any] = {}
        for table in found.get_table_names():
            shape[table] = {
                "columns": {
                    column["name"]: (str(column["type"]), column["nullable"], column.get("default"))
                    for column in found.get_columns(table)
                },
                "primary key": found.get_pk_constraint(table)["constrained_columns"],
                "foreign keys": sorted(
                    (tuple(key["constrained_columns"]), key["referred_table"], str(key["options"]))
                    for key in found.get_foreign_keys(table)
                ),
                "indexes": sorted((index["name"], tuple(index["column_names"])) for index in found.get_indexes(table)),
                "unique": sorted(
                    (unique["name"], tuple(unique["column_names"])) for unique in found.get_unique_constraints(table)
                ),
            }
        return shape

    return on_engine(url, read)


def version_rows(url: str) -> dict[str, list[str]]:
    def read(engine: Engine) -> dict[str, list[str]]:
        with engine.connect() as connection:
            tables = [name for name in inspect(connection).get_table_names() if name.startswith("alembic_version")]
            return {
                table: list(connection.execute(text(f"SELECT version_num FROM {table}")).scalars()) for table in tables
            }

    return on_engine(url, read)


@pytest.fixture
def second_url(database_url: str, tmp_path: Path) -> Iterator[str]:
    """A second empty database beside `fresh_url`'s."""
    with empty_database(database_url, f"sqlite:///{tmp_path / 'second.db'}") as url:
        yield url


def test_a_new_database_and_one_from_the_earlier_line_end_with_the_same_schema(fresh_url: str, second_url: str) -> None:
    """The branches' first revisions make, from nothing, exactly what the earlier line made by 0011; a database
    from that line is carried onto the branches, each recorded in its own version table."""
    alembic_to(fresh_url, OLD)
    open_store(fresh_url, migrate=True).close()
    open_store(second_url, migrate=True).close()
    from_earlier, new = schema_shape(fresh_url), schema_shape(second_url)
    assert from_earlier.keys() == new.keys() >= {"runs", "rounds", "llm_prompts", "alembic_version_fl"}
    for table in new:
        assert from_earlier[table] == new[table], table
    expected = {
        "alembic_version": [head_revision()],
        "alembic_version_fl": ["fl_0003"],
        "alembic_version_llm": ["llm_0002"],
    }
    assert version_rows(fresh_url) == version_rows(second_url) == expected


EXTRA_REVISION = '''"""An extra kind's table.

Revision ID: {revision}
Revises: {down}
"""

import sqlalchemy as sa
from alembic import op

revision = "{revision}"
down_revision = {down!r}
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table("extra_{revision}", sa.Column("run_id", sa.String(32), sa.ForeignKey("runs.id"), primary_key=True))


def downgrade() -> None:
    op.drop_table("extra_{revision}")
'''


def extra_branch(folder: Path, revisions: int) -> SchemaBranch:
    """A kind's branch written here: `revisions` revisions, each adding a table."""
    folder.mkdir(exist_ok=True)
    for number in range(1, revisions + 1):
        down = f"extra_{number - 1:04d}" if number > 1 else None
        script = EXTRA_REVISION.format(revision=f"extra_{number:04d}", down=down)
        (folder / f"extra_{number:04d}.py").write_text(script)
    return SchemaBranch("extra", folder)


def test_a_kind_branch_is_upgraded_on_its_own_and_left_alone_where_the_kind_is_not_installed(
    fresh_url: str, tmp_path: Path
) -> None:
    open_store(fresh_url, migrate=True).close()
    extra = extra_branch(tmp_path / "extra", 1)
    # Installed where the database has none of its tables: a reader is refused, naming the kind.
    with pytest.raises(ServiceUnavailable, match="no tables of the extra job kind"):
        connect_store(fresh_url, [*schema_branches(), extra]).close()
    connect_store(fresh_url, [*schema_branches(), extra], migrate=True).close()
    assert version_rows(fresh_url)["alembic_version_extra"] == ["extra_0001"]
    assert "extra_extra_0001" in schema_shape(fresh_url)
    # Where the kind is not installed, its tables and version table are none of the store's business.
    open_store(fresh_url).close()
    open_store(fresh_url, migrate=True).close()
    # A newer release of the kind adds a revision: only its branch moves.
    before = version_rows(fresh_url)
    newer = extra_branch(tmp_path / "extra", 2)
    connect_store(fresh_url, [*schema_branches(), newer], migrate=True).close()
    after = version_rows(fresh_url)
    assert after == {**before, "alembic_version_extra": ["extra_0002"]}
    # And a process with the older release refuses the newer tables, naming the kind, reading or migrating.
    older = extra_branch(tmp_path / "older", 1)
    for migrate in (False, True):
        with pytest.raises(
            ServiceUnavailable, match="tables of the extra job kind: schema revision extra_0002 is newer"
        ):
            connect_store(fresh_url, [*schema_branches(), older], migrate=migrate)
    assert version_rows(fresh_url) == after


def test_a_branch_needs_a_plain_name_of_its_own_and_a_folder(tmp_path: Path) -> None:
    for name in ("Extra", "extra-kind", "1extra", "", "x; DROP TABLE runs"):
        with pytest.raises(ConfigError, match="schema branch"):
            SchemaBranch(name, tmp_path)
    with pytest.raises(ConfigError, match="no folder of revisions"):
        SchemaBranch("extra", tmp_path / "missing")
    with pytest.raises(ConfigError, match="is the core's"):
        branches_with_core([SchemaBranch(CORE_BRANCH.name, tmp_path)])


def test_spilled_blobs_table_comes_and_goes_with_its_revision(fresh_url: str) -> None:
    """core_0002 adds the spilled-blob table to a database at core_0001; its downgrade drops only it."""
    open_store(fresh_url, migrate=True).close()

    def core_to(revision: str, step: Callable[[Config, str], None]) -> None:
        def run(engine: Engine) -> None:
            with engine.begin() as connection:
                config = Config()
                config.set_main_option("script_location", str(MIGRATIONS))
                config.set_main_option("path_separator", "os")
                config.set_main_option("version_locations", str(CORE_BRANCH.revisions))
                config.attributes["connection"] = connection
                step(config, revision)

        on_engine(fresh_url, run)

    def tables(engine: Engine) -> set[str]:
        with engine.connect() as connection:
            return set(inspect(connection).get_table_names())

    core_to("core_0001", command.downgrade)
    assert "spilled_blobs" not in on_engine(fresh_url, tables) and "runs" in on_engine(fresh_url, tables)
    assert revision_of(fresh_url) == "core_0001"
    open_store(fresh_url, migrate=True).close()
    assert revision_of(fresh_url) == head_revision() == "core_0002"
    assert {"key", "data", "expires_at"} == column_names(fresh_url, "spilled_blobs")


def test_run_stops_table_comes_and_goes_with_its_fl_revision(fresh_url: str) -> None:
    """fl_0002 adds the table of finished runs' stop rules to a database at fl_0001; its downgrade drops only it."""
    open_store(fresh_url, migrate=True).close()
    (fl,) = [branch for branch in schema_branches() if branch.name == "fl"]

    def fl_to(revision: str) -> None:
        def run(engine: Engine) -> None:
            with engine.begin() as connection:
                config = Config()
                config.set_main_option("script_location", str(MIGRATIONS))
                config.set_main_option("path_separator", "os")
                config.set_main_option("version_locations", str(fl.revisions))
                config.attributes["connection"] = connection
                config.attributes["version_table"] = fl.version_table
                command.downgrade(config, revision)

        on_engine(fresh_url, run)

    assert {"run_id", "rule", "reason", "version", "sim_time"} == column_names(fresh_url, "run_stops")
    fl_to("fl_0001")
    assert "run_stops" not in schema_shape(fresh_url) and "rounds" in schema_shape(fresh_url)
    assert version_rows(fresh_url)["alembic_version_fl"] == ["fl_0001"]
    assert "label_wise" not in column_names(fresh_url, "rounds")  # fl_0003, above it, went first
    open_store(fresh_url, migrate=True).close()
    assert version_rows(fresh_url)["alembic_version_fl"] == ["fl_0003"]
    assert "run_stops" in schema_shape(fresh_url) and "label_wise" in column_names(fresh_url, "rounds")
