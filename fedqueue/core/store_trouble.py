"""What is wrong with the store, in a word a user can act on: disk full, read-only, unreachable.

SQLite and Postgres say it in their own words, wrapped by SQLAlchemy; a follower waits for any of these
and says which it waits for. Errors that are not the store's (a bad query, a missing row) are None: they
are bugs or the caller's, not something that passes by waiting.
"""

from __future__ import annotations

from sqlalchemy.exc import DBAPIError, DisconnectionError

from fedqueue.errors import ServiceUnavailable

# Words in the database's own message, checked in this order (a read-only disk that is also full is read-only).
_CAUSES = (
    ("read-only", ("readonly database", "read-only", "read only")),
    ("disk full", ("database or disk is full", "no space left on device", "could not extend file", "disk full")),
    ("disk I/O error", ("disk i/o error", "input/output error")),
    ("locked", ("database is locked",)),
)
# Postgres' SQLSTATE classes for the same: 53 insufficient resources, 25006 read-only transaction, 08 connection.
_SQLSTATES = (("disk full", "53100"), ("read-only", "25006"))


def _causes(err: BaseException) -> list[BaseException]:
    """The error and what it was raised from (or during), each once."""
    seen: list[BaseException] = []
    current: BaseException | None = err
    while current is not None and all(current is not other for other in seen):
        seen.append(current)
        current = current.__cause__ or current.__context__
    return seen


def store_trouble(err: BaseException) -> str | None:
    """Why the store refused a call (`disk full`, `read-only`, `unreachable`, ...), or None when it is not the store."""
    for current in _causes(err):
        if isinstance(current, DBAPIError):
            return _cause_of(current.orig, operational=current.connection_invalidated or _is_operational(current))
        if isinstance(current, DisconnectionError):
            return "unreachable"
        if isinstance(current, ServiceUnavailable) and str(current).startswith("database "):
            return _cause_of(current, operational=True)
    return None


def _is_operational(err: DBAPIError) -> bool:
    # OperationalError and InterfaceError: the database or the connection, not the statement.
    return type(err).__name__ in ("OperationalError", "InterfaceError", "InternalError")


def _cause_of(orig: BaseException | None, operational: bool) -> str | None:
    sqlstate = str(getattr(orig, "sqlstate", None) or getattr(orig, "pgcode", None) or "")
    for cause, code in _SQLSTATES:
        if sqlstate == code:
            return cause
    message = str(orig or "").lower()
    for cause, words in _CAUSES:
        if any(word in message for word in words):
            return cause
    if sqlstate.startswith("08") or operational:
        return "unreachable"
    return None


def reason(err: BaseException) -> str:
    """The database's own first line for an error (SQLAlchemy's wrapping and its help link left out)."""
    for current in _causes(err):
        if isinstance(current, DBAPIError) and current.orig is not None:
            err = current.orig
            break
    return ((str(err) or type(err).__name__).strip().splitlines() or [type(err).__name__])[0][:200]
