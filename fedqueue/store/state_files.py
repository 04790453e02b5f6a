"""Large states (a model's weights) kept as files beside a SQLite database, named by their sha256.

A 45 MB row costs SQLite about 100 ms of CPU a commit: its pages go through the write-ahead log and back
into the database file. The same bytes as a file cost one write. So a SQLite store keeps a checkpoint's or a
kept version's bytes in `<database>-states/<run id>/<sha256>` and the row holds none (empty bytes); the
row, committed after the file is in place, is what makes a state current. Named by content, the checkpoint
and the kept version of the same bytes share one file. Postgres keeps states in its rows: its clients may be
on other hosts.

A file is written to a temporary name, flushed to disk and renamed, so a name never holds part of a state,
and it is checked against its sha256 when read. A file is removed only once no row names it; a writer that
died before its commit leaves a file no row names, removed when the run ends.

A removed file is kept as a spare (a few a run) that the next state is written over: a round's checkpoint
then writes into blocks the disk already holds, where a new file allocates them and unlinking the old one
frees them (45 MB: 20 ms in place of 46 here). A reader that opened a file just before it became a spare may
see other bytes; its sha256 then fails while the name is gone, which reads as the file having gone.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import secrets
import sqlite3
import time
from collections.abc import Iterable
from pathlib import Path

from sqlalchemy.engine import URL
from sqlalchemy.exc import OperationalError

# Errors of a full or read-only disk: raised as the database's own would be, so the store's retries and its
# outage handling (a task waits, a follower says "store: disk full") take them as they take SQLite's.
_NO_ROOM = {errno.ENOSPC: "database or disk is full", errno.EDQUOT: "database or disk is full"}
_READ_ONLY = "attempt to write a readonly database"
# A temporary file this old is a dead writer's: no live write takes minutes.
_STALE_TEMPORARY_S = 600.0
_TEMPORARY = ".tmp"
SPARE_SUFFIX = ".spare"  # a removed state's file kept to be written over
_SPARES_PER_RUN = 2  # removed files kept to be written over (a checkpoint and a kept version in flight)


class StateFileCorrupt(RuntimeError):
    """A state file whose bytes do not match the sha256 that names it."""


def sqlite_file(url: URL) -> Path | None:
    """The file of a SQLite database; None for Postgres or an in-memory database."""
    database = url.database or ":memory:"
    return Path(database) if url.get_backend_name() == "sqlite" and database != ":memory:" else None


class StateFiles:
    """The folder of a SQLite store's large states, one folder a run."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    @classmethod
    def beside(cls, url: URL) -> StateFiles | None:
        """The states folder of a SQLite file database; None for Postgres or an in-memory SQLite."""
        path = sqlite_file(url)
        if path is None or str(path).startswith("file:"):  # a URI names no plain path to put a folder beside
            return None
        return cls(path.with_name(path.name + "-states"))

    def path(self, run_id: str, sha256: str) -> Path:
        if not sha256.isalnum() or not run_id.replace("-", "").replace("_", "").isalnum():
            raise ValueError(f"not a state's name: run {run_id!r}, sha256 {sha256!r}")
        return self.folder / run_id / sha256

    def write(self, run_id: str, sha256: str, data: bytes | memoryview) -> None:
        """Put the state in place (nothing to do when its file is there: a name only ever holds whole bytes)."""
        final = self.path(run_id, sha256)
        if final.exists():
            return
        temporary = final.with_name(f"{sha256}.{secrets.token_hex(4)}{_TEMPORARY}")
        try:
            final.parent.mkdir(parents=True, exist_ok=True)
            recycled = self._take_spare(final.parent, temporary)
            with open(temporary, "r+b" if recycled else "wb") as out:
                out.write(data)
                out.truncate()  # a spare may have been longer
                out.flush()
                os.fsync(out.fileno())
            os.replace(temporary, final)
            _sync_folder(final.parent)
        except OSError as err:
            temporary.unlink(missing_ok=True)
            raise _as_store_error(err, final) from err

    def read(self, run_id: str, sha256: str) -> bytes | None:
        """The state's bytes, checked; None when no file holds them."""
        path = self.path(run_id, sha256)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return None
        if hashlib.sha256(data).hexdigest() != sha256:
            if not path.exists():
                return None  # made a spare and written over while it was read: gone, as if unlinked
            raise StateFileCorrupt(f"state file {path} does not match its sha256")
        return data

    def remove(self, run_id: str, sha256s: Iterable[str]) -> None:
        """Remove these states' files (each named by no row any more): kept as spares, up to a few a run."""
        folder = self.folder / run_id
        for sha256 in sha256s:
            path = self.path(run_id, sha256)
            free = [name for name in _spare_names() if not (folder / name).exists()]
            try:
                if free:
                    os.rename(path, folder / free[0])
                else:
                    path.unlink()
            except FileNotFoundError:
                continue

    @staticmethod
    def _take_spare(folder: Path, temporary: Path) -> bool:
        """Move a spare to `temporary` to be written over; False when there is none (a new file, then)."""
        for name in _spare_names():
            try:
                os.rename(folder / name, temporary)
                return True
            except FileNotFoundError:  # none there, or another writer took it first
                continue
        return False

    def keep_only(self, run_id: str, sha256s: Iterable[str]) -> None:
        """At a run's end: remove every file of the run but these states' (and a live writer's temporary)."""
        kept = set(sha256s)
        folder = self.folder / run_id
        if not folder.is_dir():
            return
        for path in folder.iterdir():
            if path.name.endswith(_TEMPORARY):
                if _age_s(path) < _STALE_TEMPORARY_S:
                    continue
            elif path.name in kept:
                continue
            path.unlink(missing_ok=True)
        if not kept:
            with contextlib.suppress(OSError):  # a live writer's temporary is still there
                folder.rmdir()


def _spare_names() -> list[str]:
    return [f"spare-{number}{SPARE_SUFFIX}" for number in range(_SPARES_PER_RUN)]


def _age_s(path: Path) -> float:
    try:
        return time.time() - path.stat().st_mtime
    except FileNotFoundError:
        return 0.0


def _sync_folder(folder: Path) -> None:
    """Flush the folder's entries, so the rename outlives a crash of the host as the row's commit does."""
    handle = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(handle)
    finally:
        os.close(handle)


def _as_store_error(err: OSError, path: Path) -> Exception:
    """A full or read-only disk as the store's error (the same wait as for the database); others as they are."""
    if err.errno in _NO_ROOM:
        message = _NO_ROOM[err.errno]
    elif err.errno == errno.EROFS:
        message = _READ_ONLY
    else:
        return err
    return OperationalError(f"write state file {path}", None, sqlite3.OperationalError(message))
