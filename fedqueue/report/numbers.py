"""A run's report: is it really parallel, and where does the time go? Numbers from the store, then files.

`build_report(store, run_id)` gives the numbers (what `fedqueue report --json` prints): the core's, from task
timings and utilization samples, and the run's job kind's (`KindViews.report_numbers`). `write_report` adds
timeline.png, concurrency.png, the kind's own pictures (`KindViews.report_page`) and report.html.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fedqueue.errors import ConfigError
from fedqueue.report.html import render_html
from fedqueue.report.kind import views_of
from fedqueue.report.long_table import write_table_files
from fedqueue.report.run_data import RunData, gc_paused, load_run_data
from fedqueue.report.timeline import (
    Lane,
    Span,
    concurrency_steps,
    dispatch_gaps,
    idle_while_queued,
    mean,
    parallel_efficiency,
    percentile,
)
from fedqueue.store import Store
from fedqueue.store.utilization import Sample

SLOTS_NOTE = (
    "slots = lanes observed: each worker process counts as many slots as its most tasks running at once"
    " in this run (the store does not record --slots; a worker that never overlapped counts once)"
)
EFFICIENCY_NOTE = (
    "parallel efficiency = task busy time / (wall time x slots): the share of the slots' time spent running tasks"
    " (100 % = every slot busy from submit to end)"
)
TOP_SLOWEST = 5


def build_report(store: Store, run_id: str, now: float | None = None) -> dict[str, Any]:
    """Every number of the report, read from the store (NotFound for an unknown run)."""
    with gc_paused():
        return report_of(store, load_run_data(store, run_id, now))


def report_of(store: Store, data: RunData) -> dict[str, Any]:
    """The core's numbers of a run, with what its job kind adds (FL: rounds, accuracy, simulated time;
    an LLM job: tokens per second per worker, padding, under "job")."""
    numbers = {**compute_report(data), "job": None}
    numbers.update(views_of(data.run.kind).report_numbers(store, data, numbers))
    return numbers


def compute_report(data: RunData) -> dict[str, Any]:
    """The core's numbers from a run's task timings and samples; no I/O."""
    run, spans = data.run, data.spans
    lanes = data.lanes
    slots = len(lanes)
    wall_s = max(0.0, data.end - run.created_at)
    done = [span for span in spans if span.state == "done"]
    busy_s = sum(span.busy_s for span in done)
    breakdown = time_breakdown(done, lanes, wall_s * slots)
    return {
        "id": run.id,
        "name": run.name,
        "state": run.state,
        "error": run.error,
        "created_at": run.created_at,
        "finished_at": run.finished_at,
        "wall_s": rounded(wall_s),
        "slots": slots,
        "slots_note": SLOTS_NOTE,
        "workers": sorted({f"{span.worker}:{span.pid}" for span in spans}),
        "tasks_done": len(done),
        "tasks_failed": len(spans) - len(done),
        "tasks_retried": sum(1 for span in spans if span.attempt > 1),
        "tasks_by_type": tasks_by_type(spans),
        "task_busy_s": rounded(busy_s),
        "parallel_efficiency": rounded(parallel_efficiency(busy_s, wall_s, slots), 4),
        "efficiency_note": EFFICIENCY_NOTE,
        "tasks_per_s": rounded(len(done) / wall_s if wall_s > 0 else None),
        "time": {**breakdown, **idle_breakdown(lanes, spans, run.created_at, run.created_at + wall_s, breakdown)},
        "slowest": slowest(done, TOP_SLOWEST),
        "lanes": [
            {
                "worker": lane.worker,
                "pid": lane.pid,
                "device_used": lane.device_used,
                "slot": lane.slot,
                "tasks": len(lane.spans),
                "busy_s": rounded(sum(span.busy_s for span in lane.spans)),
            }
            for lane in lanes
        ],
        "utilization": utilization_summary(data.samples),
    }


def time_breakdown(done: Sequence[Span], lanes: Sequence[Lane], capacity_s: float) -> dict[str, Any]:
    """Seconds by phase. Task phases are slot-seconds, summed over slots running side by side.

    `capacity_s` is wall time x slots: busy + between tasks + idle add up to it.
    """
    busy = sum(span.busy_s for span in done)
    load = sum(span.load_ms for span in done) / 1000
    compute = sum(span.compute_ms for span in done) / 1000
    upload = sum(span.upload_ms for span in done) / 1000
    waits = [span.wait_s for span in done]
    gaps = dispatch_gaps(lanes)
    return {
        "queue_wait_mean_s": rounded(mean(waits)),
        "queue_wait_max_s": rounded(max(waits, default=None)),
        "load_s": rounded(load),
        "compute_s": rounded(compute),
        "upload_s": rounded(upload),
        # Inside a task but outside its three phases: bookkeeping before loading, the attempt counter.
        "task_other_s": rounded(max(0.0, busy - load - compute - upload)),
        # Between two tasks of a slot with work waiting: result write, round check, ack, next fetch.
        "between_tasks_s": rounded(sum(gaps)),
        "between_tasks_mean_ms": rounded(None if not gaps else 1000 * sum(gaps) / len(gaps)),
        # Slots not running a task of the run: start-up, enqueueing, aggregation and evaluation, a round's end
        # (split for the run as a whole by `idle_breakdown`).
        "slots_idle_s": rounded(max(0.0, capacity_s - busy - sum(gaps))),
    }


def idle_breakdown(
    lanes: Sequence[Lane], spans: Sequence[Span], start: float, end: float, breakdown: dict[str, Any]
) -> dict[str, float | None]:
    """The slots' idle time of a run split three ways: before each slot's first task while tasks waited (its
    worker starting), idle later while tasks waited (dispatch gaps aside), and idle with nothing queued."""
    starting, after = idle_while_queued(lanes, spans, start, end)
    waiting = max(0.0, after - (breakdown["between_tasks_s"] or 0.0))
    idle = breakdown["slots_idle_s"] or 0.0
    return {
        "slots_starting_s": rounded(min(starting, idle)),
        "idle_tasks_waiting_s": rounded(min(waiting, max(0.0, idle - starting))),
        "idle_nothing_queued_s": rounded(max(0.0, idle - starting - waiting)),
    }


def slowest(done: Sequence[Span], count: int) -> list[dict[str, Any]]:
    ranked = sorted(done, key=lambda span: (-span.busy_s, span.task))[:count]
    return [
        {
            "task": span.task,
            "task_type": span.task_type,
            "worker": span.worker,
            "pid": span.pid,
            "device_used": span.device_used,
            "seconds": rounded(span.busy_s),
            "load_ms": rounded(span.load_ms),
            "compute_ms": rounded(span.compute_ms),
            "upload_ms": rounded(span.upload_ms),
            "attempt": span.attempt,
        }
        for span in ranked
    ]


def tasks_by_type(spans: Sequence[Span]) -> dict[str, dict[str, int]]:
    """Done and failed tasks per task type (train, aggregate, generate)."""
    counts: dict[str, dict[str, int]] = {}
    for span in spans:
        mine = counts.setdefault(span.task_type, {"done": 0, "failed": 0})
        mine["done" if span.state == "done" else "failed"] += 1
    return dict(sorted(counts.items()))


def utilization_summary(samples: Sequence[Sample]) -> list[dict[str, Any]]:
    """Per worker device: how busy it was (mean, p95) and its peak memory."""
    grouped: dict[tuple[str, int, str], list[Sample]] = defaultdict(list)
    for sample in samples:
        grouped[(sample.worker, sample.pid, sample.device_used)].append(sample)
    summary = []
    for (worker, pid, device_used), mine in sorted(grouped.items()):
        values = [sample.utilization for sample in mine]
        summary.append(
            {
                "worker": worker,
                "pid": pid,
                "device_used": device_used,
                "samples": len(mine),
                "kind": "gpu" if device_used.startswith("cuda") else "cpu",
                "utilization_mean": rounded(mean(values), 1),
                "utilization_p95": rounded(percentile(values, 95), 1),
                "memory_peak_bytes": max(sample.memory_bytes for sample in mine),
            }
        )
    return summary


def rounded(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(value, digits)


def write_report(store: Store, run_id: str, out_dir: Path, now: float | None = None) -> dict[str, Any]:
    """Write the pictures and report.html into out_dir; return the numbers."""
    with gc_paused():
        data = load_run_data(store, run_id, now)
        report = report_of(store, data)
        _write_files(data, report, out_dir)
    return report


def _write_files(data: RunData, report: dict[str, Any], out_dir: Path) -> None:
    """The pictures, report.html and the kind's tables, into out_dir."""
    # Imported here: plots loads matplotlib, which a process reading only the numbers does without.
    import fedqueue.report.plots as plots

    run_id = data.run.id
    page = views_of(data.run.kind).report_page(report)
    done = [span for span in data.spans if span.state == "done"]
    origin, end = data.run.created_at, data.end
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        name = f"run {run_id}" + (f" ({data.run.name})" if data.run.name else "")
        plots.timeline(
            out_dir / "timeline.png",
            data.lanes,
            data.spans,
            page.rounds,
            data.samples,
            origin,
            end,
            title=f"{name}: tasks per worker slot",
            words=page.words,
        )
        steps = concurrency_steps((span.started_at, span.finished_at) for span in done)
        plots.concurrency(
            out_dir / "concurrency.png",
            steps,
            report["slots"],
            page.rounds,
            origin,
            end,
            title=f"{name}: tasks running at once",
            words=page.words,
        )
        if page.draw is not None:
            page.draw(out_dir, name)
        for table in page.tables:
            write_table_files(table, out_dir, name)
        (out_dir / "report.html").write_text(render_html(report, page), encoding="utf-8")
    except OSError as err:
        raise ConfigError(f"--out: cannot write the report into {str(out_dir)!r}: {err.strerror or err}") from None
