"""Which errors come from the infrastructure (the broker, the store, the blob folder) rather than a task's own code.

A task that meets one did nothing wrong: it waits and tries again, and never uses up an attempt or
fails a device for it. The answer is a short phrase a person can act on ("broker out of memory",
"store: disk full"), or None for an error of the task's own.
"""

from __future__ import annotations

import errno
import sqlite3

import redis
import sqlalchemy.exc

# Errors of the host's disks, wherever they are met (the SQLite file, the blob folder).
_DISK_ERRNOS = {errno.ENOSPC: "disk full", errno.EDQUOT: "disk quota exceeded", errno.EROFS: "read-only"}
# SQLite says what went wrong in its message only.
_SQLITE_MESSAGES = {
    "database or disk is full": "disk full",
    "database is locked": "database locked",
    "disk i/o error": "disk I/O error",
    "attempt to write a readonly database": "read-only",
    "unable to open database file": "database file unreachable",
}
# Postgres's SQLSTATE classes that mean the server, not the statement: connection, resources, operator.
_SQLSTATE_CLASSES = {"08": "unreachable", "53": "out of resources (disk, memory or connections)", "57": "shutting down"}
_SQLSTATE_CODES = {"53100": "disk full", "25006": "read-only"}


def infrastructure_fault(err: BaseException) -> str | None:
    """What part of the infrastructure failed under `err` (or what it wraps), or None for the task's own error."""
    seen: set[int] = set()
    current: BaseException | None = err
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        fault = _fault_of(current)
        if fault is not None:
            return fault
        current = current.__cause__ or (None if current.__suppress_context__ else current.__context__)
    return None


def _fault_of(err: BaseException) -> str | None:
    if isinstance(err, redis.RedisError):
        return _broker_fault(err)
    if isinstance(err, sqlalchemy.exc.DBAPIError):
        return _store_fault(err)
    if isinstance(err, sqlite3.OperationalError):
        return _sqlite_fault(err)
    if isinstance(err, OSError) and err.errno in _DISK_ERRNOS:
        return f"blob folder: {_DISK_ERRNOS[err.errno]}"
    return None


def _broker_fault(err: redis.RedisError) -> str | None:
    if isinstance(err, redis.AuthenticationError):
        return None  # a wrong password is the user's to fix, not an outage to wait out
    if isinstance(err, redis.ConnectionError | redis.TimeoutError):
        return "broker unreachable"
    if isinstance(err, redis.ReadOnlyError):
        return "broker read-only (a replica)"
    if isinstance(err, redis.BusyLoadingError):
        return "broker loading its data"
    message = str(err)
    # redis-py raises OutOfMemoryError with the reply's "OOM" code stripped; other clients pass it on.
    if isinstance(err, redis.exceptions.OutOfMemoryError) or message.startswith("OOM") or "'maxmemory'" in message:
        return "broker out of memory"
    if message.startswith("MISCONF"):
        return "broker cannot write its snapshot"
    return None


def _store_fault(err: sqlalchemy.exc.DBAPIError) -> str | None:
    if err.connection_invalidated:
        return "store unreachable"
    original = err.orig
    if isinstance(original, sqlite3.OperationalError):
        return _sqlite_fault(original)
    sqlstate = str(getattr(original, "sqlstate", "") or "")
    if sqlstate in _SQLSTATE_CODES:
        return f"store: {_SQLSTATE_CODES[sqlstate]}"
    if sqlstate[:2] in _SQLSTATE_CLASSES:
        return f"store {_SQLSTATE_CLASSES[sqlstate[:2]]}"
    if isinstance(err, sqlalchemy.exc.OperationalError) and not sqlstate:
        # A driver error with no SQLSTATE: the connection failed before the server could answer.
        return "store unreachable"
    return None


def _sqlite_fault(err: sqlite3.OperationalError) -> str | None:
    message = str(err).lower()
    for known, fault in _SQLITE_MESSAGES.items():
        if known in message:
            return f"store: {fault}"
    return None
