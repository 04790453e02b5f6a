"""A run's large states (its checkpoint, its kept versions): in their rows, or in state files beside SQLite.

A row whose bytes are empty has them in the state file its sha256 names (fedqueue.store.state_files) or,
for a checkpoint, in the kept version of the same number (written in the same transaction).
"""

from __future__ import annotations

from collections.abc import Collection
from typing import cast

from sqlalchemy import Connection, Table, select

from fedqueue.fl.store.schema import CheckpointRow, ModelVersionRow
from fedqueue.store.repo import Store

CHECKPOINTS = cast(Table, CheckpointRow.__table__)
VERSIONS = cast(Table, ModelVersionRow.__table__)


def row_bytes(store: Store, run_id: str, sha256: str, data: bytes | memoryview) -> bytes:
    """What a row keeps of a state: nothing where its file now holds it (written before the row's commit)."""
    if store.state_files is None:
        return bytes(data)
    store.state_files.write(run_id, sha256, data)
    return b""


def state_bytes(store: Store, run_id: str, sha256: str, data: bytes) -> bytes | None:
    """A row's state: its own bytes, else its file's; None when neither holds it (its file removed since)."""
    if data or store.state_files is None:
        return data or None
    return store.state_files.read(run_id, sha256)


def unnamed(connection: Connection, run_id: str, sha256s: Collection[str]) -> set[str]:
    """Those of `sha256s` that no checkpoint or kept version of the run names (as the transaction sees it)."""
    return set(sha256s) - _named(connection, run_id) if sha256s else set()


def _named(connection: Connection, run_id: str) -> set[str]:
    """The sha256s the run's checkpoint and kept versions name."""
    named = (
        select(CHECKPOINTS.c.sha256)
        .where(CHECKPOINTS.c.run_id == run_id)
        .union(select(VERSIONS.c.sha256).where(VERSIONS.c.run_id == run_id))
    )
    return set(connection.execute(named).scalars())


def remove_states(store: Store, run_id: str, sha256s: Collection[str]) -> None:
    """After the commit that stopped naming them: their files go."""
    if store.state_files is not None and sha256s:
        store.state_files.remove(run_id, sha256s)


def keep_named_states(store: Store, run_id: str) -> None:
    """At a run's end: its folder keeps only the files its rows name (a writer that died left others)."""
    if store.state_files is None:
        return
    with store.engine.connect() as connection:
        named = _named(connection, run_id)
    store.state_files.keep_only(run_id, named)
