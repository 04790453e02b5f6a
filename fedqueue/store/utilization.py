"""Device utilization samples in the store: written in batches by workers, read back by reports."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import asdict, dataclass

from sqlalchemy import insert, select

from fedqueue.store.repo import Store
from fedqueue.store.schema import UtilizationSample


@dataclass(frozen=True)
class Sample:
    """One reading of one worker's device: GPU utilization and memory, or process CPU% and RSS."""

    worker: str
    pid: int
    device_used: str
    sampled_at: float
    utilization: float  # percent: of one GPU, or of one CPU core (a busy process may exceed 100)
    memory_bytes: int


def record_samples(store: Store, rows: Sequence[Sample]) -> None:
    """Insert readings in one transaction (one executemany, not a round trip per row)."""
    if not rows:
        return
    with store.session() as session, session.begin():
        session.execute(insert(UtilizationSample), [asdict(row) for row in rows])


def samples_between(
    store: Store, start: float, end: float, workers: Collection[tuple[str, int]] | None = None
) -> list[Sample]:
    """Readings with start <= sampled_at <= end, oldest first; only these (worker, pid) pairs if given."""
    query = select(UtilizationSample).where(UtilizationSample.sampled_at >= start, UtilizationSample.sampled_at <= end)
    if workers is not None:
        if not workers:
            return []
        # Filtered by name in SQL (an index-friendly IN), by (name, pid) below.
        query = query.where(UtilizationSample.worker.in_(sorted({name for name, _ in workers})))
    wanted = None if workers is None else set(workers)
    with store.session() as session:
        found = session.scalars(query.order_by(UtilizationSample.sampled_at, UtilizationSample.id))
        return [
            Sample(
                worker=row.worker,
                pid=row.pid,
                device_used=row.device_used,
                sampled_at=row.sampled_at,
                utilization=row.utilization,
                memory_bytes=row.memory_bytes,
            )
            for row in found
            if wanted is None or (row.worker, row.pid) in wanted
        ]
