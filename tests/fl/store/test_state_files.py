"""A SQLite store keeps checkpoints and kept versions as files beside the database, named by the rows."""

from __future__ import annotations

import errno
import hashlib
import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import func, select

from fedqueue.core.database import open_store
from fedqueue.core.infra_errors import infrastructure_fault
from fedqueue.fl.store import schedule_rows
from fedqueue.fl.store.results import load_checkpoint, save_checkpoint
from fedqueue.fl.store.schema import CheckpointRow, ModelVersionRow
from fedqueue.fl.store.states import keep_named_states
from fedqueue.store import Store
from fedqueue.store.state_files import SPARE_SUFFIX, StateFileCorrupt, StateFiles, _as_store_error
from tests.fl.store.test_checkpoint_of_kept_version import _made, _run


@pytest.fixture
def sqlite_store(tmp_path: Path) -> Iterator[Store]:
    store = open_store(f"sqlite:///{tmp_path / 'store.db'}", migrate=True)
    yield store
    store.close()


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _all_files(store: Store, run_id: str) -> set[str]:
    assert store.state_files is not None
    folder = store.state_files.folder / run_id
    return {path.name for path in folder.iterdir()} if folder.is_dir() else set()


def _files(store: Store, run_id: str) -> set[str]:
    """The run's files but its spares (removed states kept to be written over)."""
    return {name for name in _all_files(store, run_id) if not name.endswith(SPARE_SUFFIX)}


def _spares(store: Store, run_id: str) -> set[str]:
    return _all_files(store, run_id) - _files(store, run_id)


def _inode(store: Store, run_id: str, name: str) -> int:
    assert store.state_files is not None
    return (store.state_files.folder / run_id / name).stat().st_ino


def _bytes_in_rows(store: Store, run_id: str) -> int:
    with store.engine.connect() as connection:
        versions = connection.execute(
            select(func.coalesce(func.sum(func.length(ModelVersionRow.data)), 0)).where(
                ModelVersionRow.run_id == run_id
            )
        ).scalar_one()
        checkpoint = connection.execute(
            select(func.length(CheckpointRow.data)).where(CheckpointRow.run_id == run_id)
        ).scalar_one()
    return int(versions) + int(checkpoint)


def test_the_folder_sits_beside_a_sqlite_file_and_nowhere_else(tmp_path: Path) -> None:
    from sqlalchemy.engine import make_url

    beside = StateFiles.beside(make_url(f"sqlite:///{tmp_path / 'runs.db'}"))
    assert beside is not None and beside.folder == tmp_path / "runs.db-states"
    assert StateFiles.beside(make_url("sqlite://")) is None
    assert StateFiles.beside(make_url("postgresql+psycopg://localhost/test")) is None


def test_versions_and_checkpoints_live_in_files_that_go_when_no_row_names_them(sqlite_store: Store) -> None:
    store = sqlite_store
    run_id = _run(store)
    states = [f"version {version} ".encode() * 1000 for version in range(4)]

    for version in (1, 2, 3):
        made = _made(run_id, version, states[version])
        assert schedule_rows.save_pass(store, run_id, "pass", {}, version, [], {}, version - 1, [made])
        # Kept: this version and the one before it (devices may still train on it); the checkpoint names this one.
        assert _files(store, run_id) == {_sha(states[version - 1]), _sha(states[version])} - {_sha(states[0])}
        assert _bytes_in_rows(store, run_id) == 0
        checkpoint = load_checkpoint(store, run_id)
        assert checkpoint is not None and (checkpoint.version, bytes(checkpoint.data)) == (version, states[version])
        kept = schedule_rows.kept_version(store, run_id, version)
        assert kept is not None and bytes(kept.data) == states[version]

    schedule_rows.forget_versions_before(store, run_id, 4)  # the run ended on version 3
    keep_named_states(store, run_id)
    assert _all_files(store, run_id) == {_sha(states[3])}  # no spare outlives the run
    checkpoint = load_checkpoint(store, run_id)
    assert checkpoint is not None and bytes(checkpoint.data) == states[3]


def _sync_run(store: Store, checkpoint: bytes) -> str:
    """A sync run with its checkpoint of round 1 saved."""
    run_id = uuid.uuid4().hex
    store.create_run(run_id, "sync", {"dataset": "digits"}, 2, kind="fl")
    save_checkpoint(store, run_id, 1, _sha(checkpoint), checkpoint)
    return run_id


def test_a_new_sync_checkpoint_takes_the_file_of_the_one_it_replaces(sqlite_store: Store) -> None:
    store = sqlite_store
    first, second = b"round one" * 500, b"round two" * 500
    run_id = _sync_run(store, first)
    save_checkpoint(store, run_id, 1, _sha(first), first)  # a retried aggregation: the same file, kept
    assert _files(store, run_id) == {_sha(first)}
    save_checkpoint(store, run_id, 2, _sha(second), second)
    assert _files(store, run_id) == {_sha(second)}
    assert _bytes_in_rows(store, run_id) == 0
    checkpoint = load_checkpoint(store, run_id)
    assert checkpoint is not None and (checkpoint.version, bytes(checkpoint.data)) == (2, second)


def test_a_removed_state_file_is_written_over_by_the_next_state(sqlite_store: Store) -> None:
    """A replaced checkpoint's file becomes a spare, and the next checkpoint is written into it (its blocks
    already on the disk), whole and under its own name; the run's end takes the spares."""
    store = sqlite_store
    states = [f"round {number} ".encode() * (700 - 100 * number) for number in range(4)]  # each shorter
    run_id = _sync_run(store, states[1])
    first = _inode(store, run_id, _sha(states[1]))
    save_checkpoint(store, run_id, 2, _sha(states[2]), states[2])
    second = _inode(store, run_id, _sha(states[2]))
    assert _spares(store, run_id) == {"spare-0.spare"} and _inode(store, run_id, "spare-0.spare") == first

    save_checkpoint(store, run_id, 3, _sha(states[3]), states[3])
    assert _files(store, run_id) == {_sha(states[3])}
    assert _inode(store, run_id, _sha(states[3])) == first  # written over the spare, not a new file
    assert _inode(store, run_id, "spare-0.spare") == second
    assert store.state_files is not None
    assert (store.state_files.folder / run_id / _sha(states[3])).read_bytes() == states[3]  # cut to its length
    checkpoint = load_checkpoint(store, run_id)
    assert checkpoint is not None and (checkpoint.version, bytes(checkpoint.data)) == (3, states[3])

    keep_named_states(store, run_id)
    assert _all_files(store, run_id) == {_sha(states[3])}


def test_a_file_made_a_spare_while_it_was_read_reads_as_gone(
    sqlite_store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reader that opened a state's file as a newer commit made it a spare and the next state was written
    over it sees other bytes under a name no longer there: gone (its caller reads the newer row), not corrupt."""
    store = sqlite_store
    state = b"the weights" * 100
    run_id = _sync_run(store, state)
    files = store.state_files
    assert files is not None
    path = files.path(run_id, _sha(state))
    read_bytes = Path.read_bytes

    def read_as_it_is_recycled(self: Path) -> bytes:
        if self != path:
            return read_bytes(self)
        files.remove(run_id, [_sha(state)])
        return b"the next state, written over it" * 10

    monkeypatch.setattr(Path, "read_bytes", read_as_it_is_recycled)
    assert files.read(run_id, _sha(state)) is None


def test_a_state_file_that_does_not_match_its_name_is_refused(sqlite_store: Store) -> None:
    store = sqlite_store
    state = b"the weights" * 100
    run_id = _sync_run(store, state)
    assert store.state_files is not None
    store.state_files.path(run_id, _sha(state)).write_bytes(b"the weighs" * 100)
    with pytest.raises(StateFileCorrupt, match="does not match its sha256"):
        load_checkpoint(store, run_id)


def test_files_no_row_names_go_when_the_run_ends_but_a_live_writers_stay(sqlite_store: Store) -> None:
    store = sqlite_store
    state, orphan = b"checkpointed" * 100, b"a dead writer's version" * 100
    run_id = _sync_run(store, state)
    assert store.state_files is not None
    store.state_files.write(run_id, _sha(orphan), orphan)  # its writer died before its row's commit
    folder = store.state_files.folder / run_id
    stale, live = folder / "aa.dead.tmp", folder / "bb.live.tmp"
    stale.write_bytes(b"part")
    live.write_bytes(b"part")
    hour_ago = time.time() - 3600
    os.utime(stale, (hour_ago, hour_ago))

    keep_named_states(store, run_id)
    assert _files(store, run_id) == {_sha(state), live.name}


def test_a_full_disk_under_a_state_file_reads_as_the_stores_own() -> None:
    full = _as_store_error(OSError(errno.ENOSPC, "No space left on device"), Path("s"))
    assert infrastructure_fault(full) == "store: disk full"
    read_only = _as_store_error(OSError(errno.EROFS, "Read-only file system"), Path("s"))
    assert infrastructure_fault(read_only) == "store: read-only"
    other = OSError(errno.EACCES, "Permission denied")
    assert _as_store_error(other, Path("s")) is other
