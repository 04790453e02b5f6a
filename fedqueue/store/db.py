"""Engines and schema upgrades: SQLite with WAL and a busy timeout, or Postgres by URL."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, event, inspect
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, SQLAlchemyError

from fedqueue.config import mask_url
from fedqueue.errors import ConfigError, ServiceUnavailable
from fedqueue.store.repo import Store

MIGRATIONS = Path(__file__).with_name("migrations")
CONNECT_TIMEOUT_S = 5
SQLITE_BUSY_TIMEOUT_MS = 30_000


def _enable_sqlite_wal(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    # WAL lets readers work beside the single writer; the busy timeout makes writers wait, not fail.
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
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


def upgrade_schema(engine: Engine, attempts: int = 3) -> None:
    """Bring the schema to the newest Alembic revision.

    Two processes starting on a fresh database at once both try; the loser's
    transaction fails, and its retry finds the schema already current.
    """
    from alembic import command
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    for attempt in range(attempts):
        try:
            with engine.begin() as connection:
                config.attributes["connection"] = connection
                command.upgrade(config, "head")
            return
        except DBAPIError:
            if attempt == attempts - 1:
                raise
            time.sleep(0.5 * (attempt + 1))


def open_store(url: str, *, migrate: bool = False) -> Store:
    """Connect (failing within seconds, with one line, when the database is down)."""
    engine = make_engine(url)
    try:
        with engine.connect() as connection:
            has_schema = inspect(connection).has_table("runs")
        if migrate:
            upgrade_schema(engine)
        elif not has_schema:
            raise ServiceUnavailable(f"database {mask_url(url)} has no fedqueue tables yet (submit a run first)")
    except SQLAlchemyError as err:
        engine.dispose()
        reason = str(err.orig if getattr(err, "orig", None) else err).strip().splitlines()[0]
        raise ServiceUnavailable(f"database {mask_url(url)} is unreachable: {reason}") from None
    return Store(engine)
