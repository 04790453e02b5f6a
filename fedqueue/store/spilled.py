"""Blobs kept in the store because the broker had no room for them: put, read, delete, purge when expired.

Each blob lives until `expires_at` (as a Redis TTL would keep it); an expired row reads as missing.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Sequence

from sqlalchemy import delete, select

from fedqueue.store.repo import Store, dialect_insert, retry_transient, taking_new
from fedqueue.store.schema import SpilledBlobRow


@retry_transient
def put_spilled(store: Store, items: Sequence[tuple[str, bytes]], ttl_s: float) -> None:
    """Store blobs (a key put again gets the new bytes and a fresh expiry), in one transaction."""
    if not items:
        return
    expires_at = time.time() + ttl_s
    insert = dialect_insert(store.engine.dialect)(SpilledBlobRow)
    upsert = insert.on_conflict_do_update(index_elements=["key"], set_=taking_new(insert, ("data", "expires_at")))
    rows = [{"key": key, "data": data, "expires_at": expires_at} for key, data in dict(items).items()]
    with store.engine.begin() as connection:
        connection.execute(upsert, rows)


@retry_transient
def get_spilled(store: Store, keys: Collection[str]) -> dict[str, bytes]:
    """The bytes of those keys that are stored and not expired."""
    if not keys:
        return {}
    query = select(SpilledBlobRow.key, SpilledBlobRow.data).where(
        SpilledBlobRow.key.in_(sorted(set(keys))), SpilledBlobRow.expires_at > time.time()
    )
    with store.engine.connect() as connection:
        return {key: bytes(data) for key, data in connection.execute(query)}


@retry_transient
def spilled_exists(store: Store, key: str) -> bool:
    query = select(SpilledBlobRow.key).where(SpilledBlobRow.key == key, SpilledBlobRow.expires_at > time.time())
    with store.engine.connect() as connection:
        return connection.execute(query).first() is not None


@retry_transient
def delete_spilled(store: Store, keys: Collection[str]) -> None:
    if not keys:
        return
    with store.engine.begin() as connection:
        connection.execute(delete(SpilledBlobRow).where(SpilledBlobRow.key.in_(sorted(set(keys)))))


@retry_transient
def purge_expired(store: Store) -> int:
    """Drop every expired blob; how many went."""
    with store.engine.begin() as connection:
        result = connection.execute(delete(SpilledBlobRow).where(SpilledBlobRow.expires_at <= time.time()))
    return int(result.rowcount)
