"""A run's report: is it really parallel, and where does the time go? Numbers from the store, then files.

`build_report(store, run_id)` gives the numbers (what `fedqueue report --json` prints);
`write_report` adds timeline.png, concurrency.png, accuracy.png and report.html.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedqueue.errors import ConfigError
from fedqueue.report.summary import buffered_of, is_buffered, packing_of
from fedqueue.report.timeline import (
    Lane,
    Span,
    concurrency_steps,
    dispatch_gaps,
    mean,
    merge_vmapped_packs,
    pack_lanes,
    parallel_efficiency,
    percentile,
    span_of,
)
from fedqueue.store import Store
from fedqueue.store.schema import RoundRow, RunRow
from fedqueue.store.utilization import Sample, samples_between

SLOTS_NOTE = (
    "slots = lanes observed: each worker process counts as many slots as its most tasks running at once"
    " in this run (the store does not record --slots; a worker that never overlapped counts once)"
)
TOP_SLOWEST = 5


@dataclass(frozen=True, eq=False)
class RunData:
    """A run's rows, read once: what every number and picture of the report comes from."""

    run: RunRow
    rounds: list[RoundRow]
    spans: list[Span]
    samples: list[Sample]
    now: float
    buffered: dict[str, Any] = field(default_factory=dict)  # a buffered-async run's updates (summary.buffered_of)

    @property
    def end(self) -> float:
        return run_end(self.run, self.spans, self.now)


def load_run_data(store: Store, run_id: str, now: float | None = None) -> RunData:
    """Read a run's rows (NotFound for an unknown run id)."""
    run = store.get_run(run_id)
    rounds = store.list_rounds(run_id)
    spans = merge_vmapped_packs(span_of(row) for row in store.task_timings(run_id))
    now = time.time() if now is None else now
    end = run_end(run, spans, now)
    # Samples of the workers that ran this run's tasks, while it ran.
    samples = samples_between(store, run.created_at, end, {span.worker_key for span in spans})
    buffered = buffered_of(run, store.device_tasks(run_id)) if is_buffered(run) else {}
    return RunData(run=run, rounds=rounds, spans=spans, samples=samples, now=now, buffered=buffered)


def build_report(store: Store, run_id: str, now: float | None = None) -> dict[str, Any]:
    """Every number of the report, read from the store (NotFound for an unknown run)."""
    data = load_run_data(store, run_id, now)
    return {**compute_report(data), "job": job_numbers(store, data.run)}


def job_numbers(store: Store, run: RunRow) -> dict[str, Any] | None:
    """What the run's job kind adds (an LLM job: tokens per second per worker, padding), if anything."""
    from fedqueue.core import jobs

    kind = jobs.kinds().get(run.kind)
    if kind is None or kind.report_numbers is None:
        return None
    return kind.report_numbers(store, run.id)


def run_end(run: RunRow, spans: Sequence[Span], now: float) -> float:
    """When the run finished; a run still going is measured up to now."""
    if run.finished_at is not None:
        return run.finished_at
    if run.state == "running":
        return max(now, run.created_at)
    return max((span.finished_at for span in spans), default=run.created_at)


def compute_report(data: RunData) -> dict[str, Any]:
    """The report's numbers from a run's rows; no I/O."""
    run, rounds, spans, now = data.run, data.rounds, data.spans, data.now
    lanes = pack_lanes(spans)
    slots = len(lanes)
    end = data.end
    wall_s = max(0.0, end - run.created_at)
    done = [span for span in spans if span.state == "done"]
    busy_s = sum(span.busy_s for span in done)
    by_round: dict[int | None, list[Span]] = defaultdict(list)
    for span in spans:
        by_round[span.round_index].append(span)
    return {
        "id": run.id,
        "name": run.name,
        "state": run.state,
        "error": run.error,
        "dataset": run.config.get("dataset"),
        "model": run.config.get("model"),
        **packing_of(run),
        "created_at": run.created_at,
        "finished_at": run.finished_at,
        "rounds_total": run.rounds_total,
        "rounds_done": sum(1 for row in rounds if row.state == "done"),
        "wall_s": _round(wall_s),
        "slots": slots,
        "slots_note": SLOTS_NOTE,
        "workers": sorted({f"{span.worker}:{span.pid}" for span in spans}),
        "tasks_done": len(done),
        "devices_trained": sum(span.devices for span in done if span.task_type == "train"),
        "tasks_failed": len(spans) - len(done),
        "tasks_retried": sum(1 for span in spans if span.attempt > 1),
        "tasks_by_type": tasks_by_type(spans),
        "task_busy_s": _round(busy_s),
        "parallel_efficiency": _round(parallel_efficiency(busy_s, wall_s, slots), 4),
        "tasks_per_s": _round(len(done) / wall_s if wall_s > 0 else None),
        "time": time_breakdown(done, lanes, rounds, wall_s * slots),
        "rounds": [round_numbers(row, by_round.get(row.round_index, []), lanes, slots, now) for row in rounds],
        "slowest": slowest(done, TOP_SLOWEST),
        "lanes": [
            {
                "worker": lane.worker,
                "pid": lane.pid,
                "device_used": lane.device_used,
                "slot": lane.slot,
                "tasks": len(lane.spans),
                "busy_s": _round(sum(span.busy_s for span in lane.spans)),
            }
            for lane in lanes
        ],
        "utilization": utilization_summary(data.samples),
        "simulated": simulated_numbers(data, wall_s),
    }


def simulated_numbers(data: RunData, wall_s: float) -> dict[str, Any] | None:
    """Simulated against wall time, where the run models device speeds; a buffered-async run's updates."""
    config = data.run.config
    if not (data.buffered or config.get("device_speed") or config.get("communication_delay")):
        return None
    clock = [(row.round_index, row.sim_time) for row in data.rounds if row.sim_time is not None]
    sim_s = clock[-1][1] if clock else None
    return {
        "sim_s": _round(sim_s),
        "wall_s": _round(wall_s),
        # How much simulated time one second of wall time covered.
        "sim_per_wall_s": _round(sim_s / wall_s if sim_s is not None and wall_s > 0 else None),
        "sim_time": {str(index): _round(at) for index, at in clock},
        **data.buffered,
    }


def time_breakdown(
    done: Sequence[Span], lanes: Sequence[Lane], rounds: Sequence[RoundRow], capacity_s: float
) -> dict[str, Any]:
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
        "queue_wait_mean_s": _round(mean(waits)),
        "queue_wait_max_s": _round(max(waits, default=None)),
        "load_s": _round(load),
        "compute_s": _round(compute),
        "upload_s": _round(upload),
        # Inside a task but outside its three phases: bookkeeping before loading, the attempt counter.
        "task_other_s": _round(max(0.0, busy - load - compute - upload)),
        # Between two tasks of a slot with work waiting: result write, round check, ack, next fetch.
        "between_tasks_s": _round(sum(gaps)),
        "between_tasks_mean_ms": _round(None if not gaps else 1000 * sum(gaps) / len(gaps)),
        # Slots with nothing to run: start-up, enqueueing, aggregation and evaluation, the end of a round.
        "slots_idle_s": _round(max(0.0, capacity_s - busy - sum(gaps))),
        "aggregation_s": _round(sum(row.aggregate_ms or 0.0 for row in rounds) / 1000),
        "evaluation_s": _round(sum(row.eval_ms or 0.0 for row in rounds) / 1000),
    }


def round_numbers(
    row: RoundRow, spans: Sequence[Span], lanes: Sequence[Lane], slots: int, now: float
) -> dict[str, Any]:
    done = [span for span in spans if span.state == "done"]
    end = row.aggregated_at
    if end is None:
        # Still training or aggregating: measured up to now.
        end = max(now, max((span.finished_at for span in spans), default=row.enqueued_at))
    wall_s = max(0.0, end - row.enqueued_at)
    busy_s = sum(span.busy_s for span in done)
    mine = {span.task for span in spans}
    round_lanes = [
        Lane(
            lane.worker,
            lane.pid,
            lane.device_used,
            lane.slot,
            tuple(span for span in lane.spans if span.task in mine),
        )
        for lane in lanes
    ]
    # The round's own tasks, beside the aggregation that closes it.
    work = [span for span in spans if span.task_type != "aggregate"]
    work_done = [span for span in work if span.state == "done"]
    return {
        "round": row.round_index,
        "state": row.state,
        "selected": len(row.selected),
        "done": len(work_done),
        "failed": len(work) - len(work_done),
        "retried": sum(1 for span in work if span.attempt > 1),
        "enqueued_at": row.enqueued_at,
        "wall_s": _round(wall_s),
        "parallel_efficiency": _round(parallel_efficiency(busy_s, wall_s, slots), 4),
        "tasks_per_s": _round(len(done) / wall_s if wall_s > 0 else None),
        "time": time_breakdown(done, round_lanes, [row], wall_s * slots),
        "accuracy": row.accuracy,
        "loss": row.loss,
        "train_loss": row.train_loss,
        "aggregated_at": row.aggregated_at,
        "sim_time": row.sim_time,
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
            "seconds": _round(span.busy_s),
            "load_ms": _round(span.load_ms),
            "compute_ms": _round(span.compute_ms),
            "upload_ms": _round(span.upload_ms),
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
                "utilization_mean": _round(mean(values), 1),
                "utilization_p95": _round(percentile(values, 95), 1),
                "memory_peak_bytes": max(sample.memory_bytes for sample in mine),
            }
        )
    return summary


def _round(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(value, digits)


def write_report(store: Store, run_id: str, out_dir: Path, now: float | None = None) -> dict[str, Any]:
    """Write the three pictures and report.html into out_dir; return the numbers."""
    from fedqueue.report import plots
    from fedqueue.report.html import render_html

    data = load_run_data(store, run_id, now)
    report = {**compute_report(data), "job": job_numbers(store, data.run)}
    done = [span for span in data.spans if span.state == "done"]
    origin, end = data.run.created_at, data.end
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        name = f"run {run_id}" + (f" ({data.run.name})" if data.run.name else "")
        plots.timeline(
            out_dir / "timeline.png",
            pack_lanes(data.spans),
            data.spans,
            data.rounds,
            data.samples,
            origin,
            end,
            title=f"{name}: tasks per worker slot",
        )
        steps = concurrency_steps((span.started_at, span.finished_at) for span in done)
        plots.concurrency(
            out_dir / "concurrency.png",
            steps,
            report["slots"],
            data.rounds,
            origin,
            end,
            title=f"{name}: tasks running at once",
        )
        plots.accuracy(out_dir / "accuracy.png", data.rounds, title=f"{name}: accuracy and loss per round")
        if report["simulated"] is not None:
            staleness = report["simulated"].get("buffered", {}).get("staleness")
            plots.simulated(out_dir / "simulated.png", data.rounds, staleness, title=f"{name}: simulated time")
        (out_dir / "report.html").write_text(render_html(report), encoding="utf-8")
    except OSError as err:
        raise ConfigError(f"--out: cannot write the report into {str(out_dir)!r}: {err.strerror or err}") from None
    return report
