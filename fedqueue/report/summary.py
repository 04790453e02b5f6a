"""What a run did, computed from the store: progress, accuracy, workers, overlap of tasks."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Any

from fedqueue.report.timeline import merge_vmapped_packs, span_of
from fedqueue.store import Store
from fedqueue.store.schema import DeviceTaskRow, RunRow


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
    run = store.get_run(run_id)
    rounds = store.list_rounds(run_id)
    results = store.device_tasks(run_id)
    timings = merge_vmapped_packs(span_of(row) for row in store.task_timings(run_id))
    ran = [timing for timing in timings if timing.state == "done"]
    trained = [timing for timing in ran if timing.task_type == "train"]
    end = run.finished_at
    if end is None:
        end = max((timing.finished_at for timing in timings), default=run.created_at)
    return {
        "id": run.id,
        "name": run.name,
        "state": run.state,
        "error": run.error,
        "rounds_total": run.rounds_total,
        "rounds_done": sum(1 for row in rounds if row.state == "done"),
        "tasks_done": sum(1 for result in results if result.state == "done"),
        "tasks_failed": sum(1 for result in results if result.state != "done"),
        "accuracy": {str(row.round_index): row.accuracy for row in rounds if row.accuracy is not None},
        "loss": {str(row.round_index): row.loss for row in rounds if row.loss is not None},
        "final_accuracy": next((row.accuracy for row in reversed(rounds) if row.accuracy is not None), None),
        "wall_s": round(end - run.created_at, 3),
        "task_busy_s": round(sum(timing.busy_s for timing in ran), 3),
        "workers": sorted({f"{timing.worker}:{timing.pid}" for timing in timings}),
        "devices_used": sorted({timing.device_used for timing in timings}),
        # Every task type counts: an aggregation running beside device tasks is parallelism too.
        "max_concurrency": max_concurrency((timing.started_at, timing.finished_at) for timing in ran),
        "round_seconds": {
            str(row.round_index): round(row.aggregated_at - row.enqueued_at, 3)
            for row in rounds
            if row.aggregated_at is not None
        },
        "failures": [
            {
                "round": result.round_index,
                "device": result.device,
                "worker": result.worker,
                "attempts": result.attempt,
                "error": result.error,
            }
            for result in results
            if result.state != "done"
        ],
        "mean_train_ms": round(sum(t.compute_ms for t in trained) / len(trained), 2) if trained else None,
        "simulated_speeds": bool(run.config.get("device_speed") or run.config.get("communication_delay")),
        "sim_time": {str(row.round_index): round(row.sim_time, 3) for row in rounds if row.sim_time is not None},
        **packing_of(run),
        **buffered_of(run, results),
    }


def is_buffered(run: RunRow) -> bool:
    """A buffered-async FL run (FedBuff or FedRevive), as its stored config says."""
    return run.config.get("mode") in ("fedbuff", "fedrevive")


def buffered_of(run: RunRow, results: Iterable[DeviceTaskRow]) -> dict[str, Any]:
    """A buffered-async run's updates: how many were folded, dropped as stale or failed, and their staleness."""
    if not is_buffered(run):
        return {}
    fates: Counter[str] = Counter()
    staleness: Counter[int] = Counter()
    for result in results:
        if result.fate is None:
            continue
        fates[result.fate] += 1
        if result.fate != "failed" and result.staleness is not None:
            staleness[result.staleness] += 1
    return {
        "buffered": {
            "buffer_size": run.config.get("buffer_size"),
            "folded": fates["folded"],
            "stale": fates["stale"],
            "failed": fates["failed"],
            # Updates that arrived, by staleness (versions made since the one they trained on).
            "staleness": {str(s): staleness[s] for s in sorted(staleness)},
        }
    }


def packing_of(run: RunRow) -> dict[str, Any]:
    """How an FL run's devices were packed into tasks, as its stored config says; nothing for other kinds."""
    if "pack_size" not in run.config:
        return {}
    packing = {"pack_size": run.config["pack_size"], "pack_mode": run.config.get("pack_mode", "sequential")}
    if run.config.get("pack_choice"):
        packing["chosen"] = run.config["pack_choice"]
    return {"packing": packing}


def run_line(run: RunRow, rounds_done: int) -> dict[str, Any]:
    return {
        "id": run.id,
        "name": run.name,
        "state": run.state,
        "rounds": f"{rounds_done}/{run.rounds_total}" if run.rounds_total else "",  # jobs without rounds: blank
        "dataset": run.config.get("dataset") or run.config.get("input"),
        "model": run.config.get("model"),
        "created_at": run.created_at,
    }
