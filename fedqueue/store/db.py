"""Engines and schema upgrades: SQLite with WAL and a busy timeout, or Postgres by URL."""

from __future__ import annotations

import functools
import sqlite3
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import create_engine, event, text
from sqlalchemy.engine import URL, Connection, Engine, make_url
from sqlalchemy.exc import ArgumentError, SQLAlchemyError
from sqlalchemy.pool import NullPool

from fedqueue.config import mask_url
from fedqueue.errors import ConfigError, FedqueueError, ServiceUnavailable
from fedqueue.store.repo import Store

if TYPE_CHECKING:  # alembic itself is imported only when a schema is checked or upgraded
    from alembic.script import ScriptDirectory

MIGRATIONS = Path(__file__).with_name("migrations")
CONNECT_TIMEOUT_S = 5
SQLITE_BUSY_TIMEOUT_MS = 30_000
WAL_SWITCH_RETRY_S = 0.02
# Postgres advisory lock held by the migrating transaction ("fedqueue" in ASCII, a positive bigint).
MIGRATION_LOCK_KEY = 0x6665647175657565
UPGRADE_HINT = "`fedqueue submit`, `fedqueue run` or `fedqueue worker` upgrade it"


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
    _switch_to_wal(cursor)
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.close()


def make_engine(url: str) -> Engine:
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


# revisions


@functools.cache
def _scripts() -> ScriptDirectory:
    from alembic.script import ScriptDirectory

    return ScriptDirectory(str(MIGRATIONS))


def head_revision() -> str:
    """The newest revision in fedqueue's migrations: the schema this code reads and writes."""
    head = _scripts().get_current_head()
    assert head is not None, "fedqueue's migrations have no head revision"
    return head


def _known_revisions() -> set[str]:
    return {script.revision for script in _scripts().walk_revisions()}


def schema_revision(bind: Engine | Connection) -> str | None:
    """The revision the database is at, or None when it has no fedqueue schema. Reads only."""
    from alembic.runtime.migration import MigrationContext

    if isinstance(bind, Engine):
        with bind.connect() as connection:
            return schema_revision(connection)
    return MigrationContext.configure(bind).get_current_revision()


def _schema_problem(shown: str, revision: str | None) -> str:
    """One line saying why this code cannot use a schema at `revision` (one other than the head)."""
    head = head_revision()
    if revision is None:
        return f"database {shown} has no fedqueue tables (submit a run first, or start `fedqueue worker`)"
    if revision not in _known_revisions():
        return f"database {shown}: schema revision {revision} is newer than this fedqueue's {head}; upgrade fedqueue"
    return f"database {shown}: schema is at revision {revision} but this fedqueue needs {head} ({UPGRADE_HINT})"


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


def _sqlite_file(url: URL) -> Path | None:
    """The file of a SQLite database; None for Postgres or an in-memory database."""
    database = url.database or ":memory:"
    return Path(database) if url.get_backend_name() == "sqlite" and database != ":memory:" else None


def _upgrade_in_one_transaction(engine: Engine, shown: str) -> None:
    from alembic import command
    from alembic.config import Config

    with engine.begin() as connection:
        if connection.dialect.name == "postgresql":
            # Concurrent migrators queue here; each next one finds the schema current.
            connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": MIGRATION_LOCK_KEY})
        revision = schema_revision(connection)
        if revision is not None and revision not in _known_revisions():
            raise ServiceUnavailable(_schema_problem(shown, revision))
        config = Config()
        config.set_main_option("script_location", str(MIGRATIONS))
        config.attributes["connection"] = connection
        command.upgrade(config, "head")


def upgrade_schema(engine: Engine, shown: str | None = None) -> None:
    """Bring the schema to the newest revision in one transaction, one migrator at a time.

    Readers see the old schema or the new one, never a part of the upgrade.
    """
    shown = shown or engine.url.render_as_string(hide_password=True)
    if _sqlite_file(engine.url) is None:
        _upgrade_in_one_transaction(engine, shown)  # Postgres DDL is transactional; in-memory SQLite is private
        return
    migrator = _sqlite_migrator(engine.url)
    try:
        _upgrade_in_one_transaction(migrator, shown)
    finally:
        migrator.dispose()


def _require_current_schema(engine: Engine, shown: str) -> None:
    revision = schema_revision(engine)
    if revision != head_revision():
        raise ServiceUnavailable(_schema_problem(shown, revision))


def open_store(url: str, *, migrate: bool = False) -> Store:
    """Connect (failing within seconds, with one line, when the database is down).

    With `migrate`, upgrade the schema to the newest revision; without, change nothing and refuse a schema
    this code cannot use.
    """
    engine = make_engine(url)
    shown = mask_url(url)
    try:
        if migrate:
            upgrade_schema(engine, shown)
        elif (path := _sqlite_file(engine.url)) is not None and not path.exists():  # connecting would create it
            raise ServiceUnavailable(_schema_problem(shown, None))
        else:
            _require_current_schema(engine, shown)
    except SQLAlchemyError as err:
        engine.dispose()
        reason = str(getattr(err, "orig", None) or err).strip().splitlines()[0]
        raise ServiceUnavailable(f"database {shown} is unreachable: {reason}") from None
    except FedqueueError:
        engine.dispose()
        raise
    return Store(engine)
