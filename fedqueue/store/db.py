"""Engines and schema upgrades: SQLite with WAL and a busy timeout, or Postgres by URL."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, event
from sqlalchemy.engine import URL, Connection, Engine, ExceptionContext, make_url
from sqlalchemy.exc import ArgumentError, SQLAlchemyError
from sqlalchemy.pool import NullPool

from fedqueue.config import database_url_problem, mask_url
from fedqueue.errors import ConfigError, FedqueueError, ServiceUnavailable
from fedqueue.store.migrate import (
    CORE_BRANCH,
    SchemaBranch,
    branches_with_core,
    require_current_schema,
    schema_problem,
    upgrade_in_transaction,
)
from fedqueue.store.repo import Store
from fedqueue.store.state_files import sqlite_file

CONNECT_TIMEOUT_S = 5
SQLITE_BUSY_TIMEOUT_MS = 30_000
WAL_SWITCH_RETRY_S = 0.02
# A new SQLite file's page size: a 45 MB checkpoint written in 64 KiB pages costs about half what it costs in
# the default 4 KiB ones (an overflow chain 16x shorter); a small commit costs some tens of microseconds more.
# A file keeps the size it was made with (a WAL file cannot change it).
SQLITE_PAGE_SIZE = 65536
# How much the WAL holds before a commit folds it back into the file: SQLite counts it in pages (1000 by default,
# 4 MB in its default pages), which in 64 KiB pages would let the WAL grow to 64 MB beside the file, more than a
# small disk holds. The same bytes whatever the page size.
WAL_CHECKPOINT_BYTES = 4 * 1024 * 1024


def _switch_to_wal(cursor: Any) -> None:
    # Switching a new file to WAL takes its exclusive lock, and while another connection switches it SQLite
    # refuses at once instead of waiting out the busy timeout: wait here instead, as long as that timeout.
    deadline = time.monotonic() + SQLITE_BUSY_TIMEOUT_MS / 1000
    while True:
        try:
            cursor.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as err:
            if "locked" not in str(err) or time.monotonic() > deadline:
                raise
            time.sleep(WAL_SWITCH_RETRY_S)


def _enable_sqlite_wal(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    # WAL lets readers work beside the single writer; the busy timeout makes writers wait, not fail.
    cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
    cursor.execute(f"PRAGMA page_size={SQLITE_PAGE_SIZE}")  # before the switch to WAL: only a new file takes it
    _switch_to_wal(cursor)
    page_size = cursor.execute("PRAGMA page_size").fetchone()[0]
    cursor.execute(f"PRAGMA wal_autocheckpoint={max(1, WAL_CHECKPOINT_BYTES // page_size)}")
    cursor.execute("PRAGMA synchronous=NORMAL")
    # SQLite's own default, which some builds (Debian's among them) turn on: zeroing a deleted row's pages writes
    # a replaced 45 MB checkpoint or version once more through the WAL, a third of a commit's CPU.
    cursor.execute("PRAGMA secure_delete=OFF")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.close()


def _drop_locked_connection(context: ExceptionContext) -> None:
    # A connection whose read was cut short (an exception mid-fetch, its traceback still holding the cursor) keeps
    # that read's snapshot through the pool's rollback: once another connection writes, every write on it is
    # refused at once as "database is locked", the busy timeout never waited out. Replace that one connection, so
    # the store's retry (and every later call) runs on a fresh one.
    error = context.original_exception
    if isinstance(error, sqlite3.OperationalError) and "locked" in str(error):
        context.is_disconnect = True
        context.invalidate_pool_on_disconnect = False


def make_engine(url: str) -> Engine:
    problem = database_url_problem(url)
    if problem is not None:  # SQLAlchemy's own refusal is a page of traceback
        raise ConfigError(f"FEDQUEUE_DATABASE_URL: {problem}")
    try:
        parsed = make_url(url)
    except ArgumentError:
        raise ConfigError(f"FEDQUEUE_DATABASE_URL: not a database URL: {mask_url(url)}") from None
    backend = parsed.get_backend_name()
    if backend == "sqlite":
        database = parsed.database or ""
        if database and database != ":memory:" and not Path(database).parent.exists():
            raise ServiceUnavailable(f"database: folder of {database!r} does not exist")
        engine = create_engine(parsed, connect_args={"timeout": SQLITE_BUSY_TIMEOUT_MS / 1000})
        event.listen(engine, "connect", _enable_sqlite_wal)
        event.listen(engine, "handle_error", _drop_locked_connection)
        return engine
    if backend == "postgresql":
        if parsed.drivername == "postgresql":
            parsed = parsed.set(drivername="postgresql+psycopg")
        return create_engine(
            parsed,
            pool_pre_ping=True,  # a dropped connection is replaced, not reported as an error
            connect_args={"connect_timeout": CONNECT_TIMEOUT_S},
        )
    raise ConfigError(f"FEDQUEUE_DATABASE_URL: unsupported database {backend!r} (use sqlite or postgresql)")


# upgrades


def _connect_for_migration(dbapi_connection: Any, record: Any) -> None:
    _enable_sqlite_wal(dbapi_connection, record)
    # pysqlite runs DDL outside any transaction unless it leaves BEGIN to us.
    dbapi_connection.isolation_level = None


def _begin_immediate(connection: Connection) -> None:
    # IMMEDIATE takes the write lock at once: a second migrator waits here, then finds the schema current.
    connection.exec_driver_sql("BEGIN IMMEDIATE")


def _sqlite_migrator(url: URL) -> Engine:
    """A short-lived engine whose one transaction holds the whole upgrade, DDL included."""
    engine = create_engine(url, poolclass=NullPool, connect_args={"timeout": SQLITE_BUSY_TIMEOUT_MS / 1000})
    event.listen(engine, "connect", _connect_for_migration)
    event.listen(engine, "begin", _begin_immediate)
    return engine


def upgrade_schema(engine: Engine, branches: Sequence[SchemaBranch], shown: str | None = None) -> None:
    """Bring the core's branch and the given kinds' branches to their newest revisions in one transaction, one
    migrator at a time. Readers see the old schema or the new one, never a part of the upgrade.
    """
    shown = shown or engine.url.render_as_string(hide_password=True)
    every_branch = branches_with_core(branches)
    # Postgres DDL is transactional; in-memory SQLite is private; a SQLite file needs one transaction of its own.
    migrator = engine if sqlite_file(engine.url) is None else _sqlite_migrator(engine.url)
    try:
        with migrator.begin() as connection:
            upgrade_in_transaction(connection, every_branch, shown)
    finally:
        if migrator is not engine:
            migrator.dispose()


def connect_store(url: str, branches: Sequence[SchemaBranch], *, migrate: bool = False) -> Store:
    """Connect (failing within seconds, with one line, when the database is down) to the core's tables and the
    tables of the kinds whose schema branches are given (`fedqueue.core.database.open_store` gives every
    installed kind's).

    With `migrate`, upgrade each branch to its newest revision; without, change nothing and refuse a schema
    this code cannot use.
    """
    engine = make_engine(url)
    shown = mask_url(url)
    try:
        if migrate:
            upgrade_schema(engine, branches, shown)
        elif (path := sqlite_file(engine.url)) is not None and not path.exists():  # connecting would create it
            raise ServiceUnavailable(schema_problem(shown, CORE_BRANCH, None) or "")
        else:
            require_current_schema(engine, branches_with_core(branches), shown)
    except SQLAlchemyError as err:
        engine.dispose()
        reason = str(getattr(err, "orig", None) or err).strip().splitlines()[0]
        raise ServiceUnavailable(f"database {shown} is unreachable: {reason}") from None
    except FedqueueError:
        engine.dispose()
        raise
    return Store(engine)
