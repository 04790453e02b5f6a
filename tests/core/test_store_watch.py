"""fedqueue.core.waits.store_watch: the causes named, the lines, the fallback, the retry, the limit."""

from __future__ import annotations

import sqlite3

import pytest
from sqlalchemy.exc import IntegrityError, OperationalError

from fedqueue.core.waits.store_watch import StoreGone, StoreWatch, store_trouble
from fedqueue.errors import NotFound


def sqlite_error(message: str) -> OperationalError:
    return OperationalError("UPDATE runs SET ...", {}, sqlite3.OperationalError(message))


class PgError(Exception):
    """Postgres' errors carry their SQLSTATE."""

    def __init__(self, message: str, sqlstate: str) -> None:
        super().__init__(message)
        self.sqlstate = sqlstate


def test_store_errors_are_named_by_what_the_store_lacks() -> None:
    assert store_trouble(sqlite_error("database or disk is full")) == "disk full"
    assert store_trouble(sqlite_error("attempt to write a readonly database")) == "read-only"
    assert store_trouble(sqlite_error("unable to open database file")) == "database file unreachable"
    assert store_trouble(sqlite_error("disk I/O error")) == "disk I/O error"
    assert store_trouble(OperationalError("INSERT", {}, PgError("could not extend file", "53100"))) == "disk full"
    assert store_trouble(OperationalError("INSERT", {}, PgError("read-only transaction", "25006"))) == "read-only"
    assert store_trouble(OperationalError("SELECT", {}, PgError("connection refused", "08001"))) == "unreachable"
    try:
        try:
            raise sqlite_error("database or disk is full")
        except OperationalError as err:
            raise RuntimeError("repair failed") from err
    except RuntimeError as wrapped:
        assert store_trouble(wrapped) == "disk full"


def test_errors_that_are_not_the_stores_are_none() -> None:
    assert store_trouble(IntegrityError("INSERT", {}, sqlite3.IntegrityError("UNIQUE constraint failed"))) is None
    assert store_trouble(ValueError("not the store")) is None
    assert store_trouble(NotFound("run r1 not found")) is None
    assert store_trouble(sqlite_error("no such table: runs")) is None  # a bug, not an outage to wait out
    assert store_trouble(OSError(28, "No space left on device")) is None  # the blob folder's, not the store's


def test_a_watch_says_once_each_way_falls_back_meanwhile_and_gives_up_after_its_wait() -> None:
    now = [0.0]
    lines: list[str] = []
    full = [True]
    tries = [0]
    watch = StoreWatch("r1", 10, lines.append, clock=lambda: now[0])

    def step() -> int:
        tries[0] += 1
        if full[0]:
            raise sqlite_error("database or disk is full")
        return 1

    def fallback() -> int:
        return -1

    assert watch.call(step, fallback) == -1
    assert watch.down
    assert lines == ["store: disk full; waiting (database or disk is full)"]
    assert watch.call(step, fallback) == -1  # no try due yet: the fallback, the step not run
    assert tries[0] == 1
    now[0] = 4.0
    assert watch.call(step, fallback) == -1  # tried again: still full, nothing more said
    assert tries[0] == 2 and len(lines) == 1
    full[0] = False
    now[0] = 6.0
    assert watch.call(step, fallback) == 1
    assert lines[1:] == ["store back after 6 s: run r1 goes on"]
    assert not watch.down
    full[0] = True
    assert watch.call(step, fallback) == -1
    assert len(lines) == 3
    now[0] = 16.0
    with pytest.raises(StoreGone, match=r"run r1 continues when its workers and store are back: `fedqueue resume r1`"):
        watch.call(step, fallback)


def test_other_errors_pass_through_the_watch() -> None:
    watch = StoreWatch("r1", 10, lambda line: None)

    def broken() -> None:
        raise ValueError("not the store")

    with pytest.raises(ValueError, match="not the store"):
        watch.call(broken, lambda: None)
    assert not watch.down
