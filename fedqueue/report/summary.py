"""What a run did, computed from the store: state, workers, overlap of tasks; each kind adds its own keys."""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import Any

from fedqueue.config import DEFAULT_LEASE_TTL_S
from fedqueue.report.kind import views_of
from fedqueue.report.run_data import gc_paused, read_spans
from fedqueue.report.timeline import merge_vmapped_packs
from fedqueue.store import Store
from fedqueue.store.schema import RunRow

# A launcher looks for unfollowed runs every 2 s: a run just past the grace may wait that long for one.
ADOPTION_SLACK_S = 5.0


def max_concurrency(intervals: Iterable[tuple[float, float]]) -> int:
    """The largest number of [start, finish] intervals that overlap at one instant."""
    events: list[tuple[float, int]] = []
    for start, finish in intervals:
        events.append((start, 1))
        events.append((finish, -1))
    # At equal times a finish sorts before a start: touching intervals do not overlap.
    events.sort(key=lambda event: (event[0], event[1]))
    running = peak = 0
    for _, step in events:
        running += step
        peak = max(peak, running)
    return peak


def run_summary(store: Store, run_id: str) -> dict[str, Any]:
    """A run's status: what its task timings say, with the keys its job kind adds (`KindViews.summary`)."""
    with gc_paused():
        return _run_summary(store, run_id)


def _run_summary(store: Store, run_id: str) -> dict[str, Any]:
    run = store.get_run(run_id)
    spans = merge_vmapped_packs(read_spans(store, run_id))
    ran = [span for span in spans if span.state == "done"]
    end = run.finished_at
    if end is None:
        end = max((span.finished_at for span in spans), default=run.created_at)
    summary = {
        "id": run.id,
        "name": run.name,
        "state": run.state,
        "error": run.error,
        "tasks_done": len(ran),
        "tasks_failed": len(spans) - len(ran),
        "wall_s": round(end - run.created_at, 3),
        "task_busy_s": round(sum(span.busy_s for span in ran), 3),
        "workers": sorted({f"{span.worker}:{span.pid}" for span in spans}),
        "devices_used": sorted({span.device_used for span in spans}),
        # Every task type counts: an aggregation running beside device tasks is parallelism too.
        "max_concurrency": max_concurrency((span.started_at, span.finished_at) for span in ran),
    }
    summary.update(views_of(run.kind).summary(store, run, spans))
    return summary


def run_lines(
    store: Store, runs: Sequence[RunRow], now: float | None = None, lease_ttl_s: float = DEFAULT_LEASE_TTL_S
) -> list[dict[str, Any]]:
    """`fedqueue runs`: a line per run, in the order given; each kind fills its columns (`KindViews.run_columns`):
    `type` (its kind, or what kind of job within it), `progress`, `accuracy`, and the older `rounds`, `dataset`,
    `model`."""
    now = time.time() if now is None else now
    lines = {
        run.id: {
            "id": run.id,
            "name": run.name,
            "kind": run.kind,
            "type": run.kind,
            "state": run.state,
            "stalled": stalled(run, now, lease_ttl_s),
            "progress": "",
            "accuracy": None,
            "rounds": "",  # blank for kinds without rounds
            "dataset": None,
            "model": None,
            "created_at": run.created_at,
        }
        for run in runs
    }
    by_kind: dict[str, list[RunRow]] = defaultdict(list)
    for run in runs:
        by_kind[run.kind].append(run)
    for name, mine in by_kind.items():
        for run_id, columns in views_of(name).run_columns(store, mine).items():
            lines[run_id].update(columns)
    return list(lines.values())


def stalled(run: RunRow, now: float, lease_ttl_s: float) -> bool:
    """A running run that nothing schedules: no follower (`run`, `resume`) nor worker launcher holds its lease.

    Its workers may still finish the tasks they hold, but lost work is repaired by no one, and after a Ctrl-C
    with the command's own workers gone, nothing runs at all. A run younger than the launchers' grace (they
    adopt an unfollowed run once it is a lease's length old) is not stalled yet.
    """
    if run.state != "running" or run.created_at > now - lease_ttl_s - ADOPTION_SLACK_S:
        return False
    return run.lease_owner is None or (run.lease_expires_at or 0.0) < now
