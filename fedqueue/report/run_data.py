"""A run's rows for its report, read once: the run, its tasks as spans, its workers' samples."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from fedqueue.report.timeline import Span, merge_vmapped_packs, span_of
from fedqueue.store import Store
from fedqueue.store.schema import RunRow
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


def load_run_data(store: Store, run_id: str, now: float | None = None) -> RunData:
    """Read a run's rows (NotFound for an unknown run id)."""
    run = store.get_run(run_id)
    spans = merge_vmapped_packs(span_of(row) for row in store.task_timings(run_id))
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
