"""A run's rows for its report, read once: the run, its tasks as spans, its workers' samples."""

from __future__ import annotations

import contextlib
import gc
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import cached_property

from sqlalchemy import select

from fedqueue.report.timeline import Lane, Span, merge_vmapped_packs, pack_lanes
from fedqueue.store import Store
from fedqueue.store.schema import RunRow, TaskTimingRow
from fedqueue.store.utilization import Sample, samples_between


@dataclass(frozen=True, eq=False)
class RunData:
    """A run's rows, read once: what every number and picture of the report comes from."""

    run: RunRow
    spans: list[Span]
    samples: list[Sample]
    now: float

    @property
    def end(self) -> float:
        return run_end(self.run, self.spans, self.now)

    @cached_property
    def lanes(self) -> list[Lane]:
        """The worker slots' lanes (`pack_lanes`), packed once for every number and picture."""
        return pack_lanes(self.spans)


def load_run_data(store: Store, run_id: str, now: float | None = None) -> RunData:
    """Read a run's rows (NotFound for an unknown run id)."""
    run = store.get_run(run_id)
    spans = merge_vmapped_packs(read_spans(store, run_id))
    now = time.time() if now is None else now
    end = run_end(run, spans, now)
    # Samples of the workers that ran this run's tasks, while it ran.
    samples = samples_between(store, run.created_at, end, {span.worker_key for span in spans})
    return RunData(run=run, spans=spans, samples=samples, now=now)


def run_end(run: RunRow, spans: Sequence[Span], now: float) -> float:
    """When the run finished; a run still going is measured up to now."""
    if run.finished_at is not None:
        return run.finished_at
    if run.state == "running":
        return max(now, run.created_at)
    return max((span.finished_at for span in spans), default=run.created_at)


# A Span's fields are the timing table's columns of the same names, but `devices` (1 for every row).
_SPAN_COLUMNS = [getattr(TaskTimingRow, name) for name in Span.__dataclass_fields__ if name != "devices"]


def read_spans(store: Store, run_id: str, finished_after: float | None = None) -> list[Span]:
    """A run's task timings as spans, in start order; only those that ended after `finished_after` if given.

    Read as plain rows, not ORM objects: a long run has 100,000 of them, and objects cost several times the time."""
    query = select(*_SPAN_COLUMNS).where(TaskTimingRow.run_id == run_id)
    if finished_after is not None:
        query = query.where(TaskTimingRow.finished_at > finished_after)
    with store.engine.connect() as connection:
        rows = connection.execute(query.order_by(TaskTimingRow.started_at, TaskTimingRow.id))
        return [Span(*row) for row in rows]  # the columns in the order of its fields


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """No cyclic garbage collection while a report is made: it makes no cycles to collect, and a long run's
    hundreds of thousands of rows, scanned again and again as they are made, doubled its time."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
