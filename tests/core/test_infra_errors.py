"""Which errors are the infrastructure's (waited out, never counted against a task) and which are a task's own."""

from __future__ import annotations

import errno
import sqlite3
from pathlib import Path

import pytest
import redis
import sqlalchemy
import sqlalchemy.exc

from fedqueue.core.infra_errors import infrastructure_fault
from fedqueue.queue.embedded import free_port


def _raised(action: object) -> BaseException:
    try:
        action()  # type: ignore[operator]
    except BaseException as err:  # noqa: BLE001 - the error is what the test looks at
        return err
    raise AssertionError("expected an error")


def test_a_broker_that_does_not_answer_is_unreachable() -> None:
    client = redis.Redis(port=free_port(), socket_connect_timeout=0.5)
    assert infrastructure_fault(_raised(client.ping)) == "broker unreachable"


def test_a_full_broker_is_out_of_memory_and_other_replies_are_the_task_s() -> None:
    full = redis.exceptions.ResponseError("OOM command not allowed when used memory > 'maxmemory'.")
    assert infrastructure_fault(full) == "broker out of memory"
    assert infrastructure_fault(redis.exceptions.ResponseError("WRONGTYPE Operation against a key")) is None
    assert infrastructure_fault(redis.exceptions.AuthenticationError("invalid password")) is None


def test_a_full_sqlite_file_is_a_full_store_and_a_missing_table_is_not(tmp_path: Path) -> None:
    engine = sqlalchemy.create_engine(f"sqlite:///{tmp_path / 'full.db'}")
    with engine.begin() as connection:
        connection.exec_driver_sql("CREATE TABLE blobs (data BLOB)")
    with engine.connect() as connection:
        connection.exec_driver_sql("PRAGMA max_page_count = 3")  # what a full disk looks like to SQLite
        full = _raised(lambda: connection.exec_driver_sql("INSERT INTO blobs VALUES (zeroblob(100000))"))
        missing = _raised(lambda: connection.exec_driver_sql("SELECT * FROM nowhere"))
    engine.dispose()
    assert isinstance(full, sqlalchemy.exc.OperationalError) and infrastructure_fault(full) == "store: disk full"
    assert isinstance(missing, sqlalchemy.exc.OperationalError) and infrastructure_fault(missing) is None
    assert infrastructure_fault(sqlite3.OperationalError("database is locked")) == "store: database locked"


def test_a_postgres_that_refuses_connections_is_unreachable() -> None:
    engine = sqlalchemy.create_engine(f"postgresql+psycopg://nobody@127.0.0.1:{free_port()}/test")
    assert infrastructure_fault(_raised(engine.connect)) == "store unreachable"
    engine.dispose()


def test_errors_wrapped_by_the_task_are_found_and_its_own_errors_are_not() -> None:
    try:
        try:
            raise redis.ConnectionError("connection reset")
        except redis.ConnectionError as inner:
            raise RuntimeError("storing the result failed") from inner
    except RuntimeError as outer:
        assert infrastructure_fault(outer) == "broker unreachable"
    assert infrastructure_fault(OSError(errno.ENOSPC, "No space left on device")) == "blob folder: disk full"
    assert infrastructure_fault(OSError(errno.ENOENT, "No such file")) is None
    assert infrastructure_fault(ValueError("poisoned sample")) is None


@pytest.mark.parametrize("code", ["53100", "25006", "08006", "57P01"])
def test_postgres_states_of_the_server_are_the_store_s(code: str) -> None:
    class DriverError(Exception):
        sqlstate = code

    wrapped = sqlalchemy.exc.OperationalError("INSERT ...", {}, DriverError("server said no"))
    assert (infrastructure_fault(wrapped) or "").startswith("store")


def test_a_statement_the_server_refuses_is_the_task_s() -> None:
    class Duplicate(Exception):
        sqlstate = "23505"

    assert infrastructure_fault(sqlalchemy.exc.IntegrityError("INSERT ...", {}, Duplicate("duplicate key"))) is None


def test_a_command_caught_by_a_broker_fault_ends_in_one_line_not_a_traceback(
    capsys: pytest.CaptureFixture[str],
) -> None:
    import typer

    from fedqueue.cli.common import friendly_errors

    @friendly_errors
    def submit() -> None:
        raise redis.exceptions.OutOfMemoryError("command not allowed when used memory > 'maxmemory'.")

    @friendly_errors
    def buggy() -> None:
        raise KeyError("a bug of fedqueue's own")

    with pytest.raises(typer.Exit) as ended:
        submit()
    assert ended.value.exit_code == 1
    line = capsys.readouterr().err.strip()
    assert line.startswith("error: broker out of memory (command not allowed") and "\n" not in line
    with pytest.raises(KeyError):  # not the infrastructure's: left to show itself
        buggy()
