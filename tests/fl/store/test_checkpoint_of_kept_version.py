"""A buffered run's checkpoint names its kept version instead of holding the same bytes twice."""

from __future__ import annotations

import hashlib
import time
import uuid

from sqlalchemy import func, select

from fedqueue.fl.store import schedule_rows
from fedqueue.fl.store.results import load_checkpoint
from fedqueue.fl.store.schema import CheckpointRow, RoundRow
from fedqueue.store import Store


def _run(store: Store) -> str:
    run_id = uuid.uuid4().hex
    store.create_run(run_id, "checkpoint", {"dataset": "digits", "mode": "fedbuff"}, 3, kind="fl")
    assert schedule_rows.create_schedule(store, run_id, {}, 0)
    assert schedule_rows.claim_schedule(store, run_id, "pass", time.time() - 60) is not None
    return run_id


def _made(run_id: str, version: int, data: bytes, last: bool = False) -> schedule_rows.MadeVersion:
    sha = hashlib.sha256(data).hexdigest()
    next_round = RoundRow(
        run_id=run_id,
        round_index=version + 1,
        version=version,
        state="training",
        selected=[],
        model_key=f"{run_id}/model/{version}",
        model_sha256=sha,
        model_nbytes=len(data),
        enqueued_at=time.time(),
    )
    return schedule_rows.MadeVersion(version, sha, data, {}, None if last else next_round)


def _stored_bytes(store: Store, run_id: str) -> int:
    """The bytes the checkpoint holds itself: in its row, or in the state file its row names (SQLite)."""
    query = select(func.length(CheckpointRow.data), CheckpointRow.sha256).where(CheckpointRow.run_id == run_id)
    with store.engine.connect() as connection:
        in_row, sha256 = connection.execute(query).one()
    if store.state_files is None or in_row:
        return int(in_row)
    path = store.state_files.path(run_id, sha256)
    return path.stat().st_size if path.exists() else 0


def _save(store: Store, run_id: str, version: int, made: schedule_rows.MadeVersion, needed_from: int) -> None:
    assert schedule_rows.save_pass(store, run_id, "pass", {}, version, [], {}, needed_from, [made])


def test_a_kept_version_is_checkpointed_once_and_read_back_until_the_run_forgets_it(store: Store) -> None:
    run_id = _run(store)
    first, second = b"version one" * 100, b"version two" * 100

    _save(store, run_id, 1, _made(run_id, 1, first), needed_from=1)
    if store.state_files is None:
        assert _stored_bytes(store, run_id) == 0  # the kept version holds the bytes
    checkpoint = load_checkpoint(store, run_id)
    assert checkpoint is not None and (checkpoint.version, bytes(checkpoint.data)) == (1, first)

    _save(store, run_id, 2, _made(run_id, 2, second), needed_from=2)  # version 1 is dropped
    checkpoint = load_checkpoint(store, run_id)
    assert checkpoint is not None and (checkpoint.version, bytes(checkpoint.data)) == (2, second)

    # The run ends: its kept versions go, and the checkpoint takes its bytes before they do.
    schedule_rows.forget_versions_before(store, run_id, 3)
    assert schedule_rows.kept_version(store, run_id, 2) is None
    assert _stored_bytes(store, run_id) == len(second)
    checkpoint = load_checkpoint(store, run_id)
    assert checkpoint is not None and (checkpoint.version, bytes(checkpoint.data)) == (2, second)
    assert checkpoint.sha256 == hashlib.sha256(second).hexdigest()


def test_the_last_version_is_checkpointed_with_its_bytes(store: Store) -> None:
    run_id = _run(store)
    last = b"the last version" * 50
    _save(store, run_id, 1, _made(run_id, 1, last, last=True), needed_from=1)
    assert _stored_bytes(store, run_id) == len(last)
    schedule_rows.forget_versions_before(store, run_id, 2)
    checkpoint = load_checkpoint(store, run_id)
    assert checkpoint is not None and bytes(checkpoint.data) == last
