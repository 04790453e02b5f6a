"""What a run did, computed from the store: progress, accuracy, workers, overlap of tasks."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from fedqueue.store import Store
from fedqueue.store.schema import RunRow


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
    tasks = store.device_tasks(run_id)
    done = [task for task in tasks if task.state == "done"]
    end = run.finished_at
    if end is None:
        end = max((task.finished_at for task in tasks), default=run.created_at)
    busy_s = sum(task.finished_at - task.started_at for task in done)
    return {
        "id": run.id,
        "name": run.name,
        "state": run.state,
        "error": run.error,
        "rounds_total": run.rounds_total,
        "rounds_done": sum(1 for row in rounds if row.state == "done"),
        "tasks_done": len(done),
        "tasks_failed": len(tasks) - len(done),
        "accuracy": {str(row.round_index): row.accuracy for row in rounds if row.accuracy is not None},
        "loss": {str(row.round_index): row.loss for row in rounds if row.loss is not None},
        "final_accuracy": next((row.accuracy for row in reversed(rounds) if row.accuracy is not None), None),
        "wall_s": round(end - run.created_at, 3),
        "task_busy_s": round(busy_s, 3),
        "workers": sorted({f"{task.worker}:{task.pid}" for task in tasks}),
        "devices_used": sorted({task.device_used for task in tasks}),
        "max_concurrency": max_concurrency((task.started_at, task.finished_at) for task in done),
        "round_seconds": {
            str(row.round_index): round(row.aggregated_at - row.enqueued_at, 3)
            for row in rounds
            if row.aggregated_at is not None
        },
        "failures": [
            {
                "round": task.round_index,
                "device": task.device,
                "worker": task.worker,
                "attempts": task.attempt,
                "error": task.error,
            }
            for task in tasks
            if task.state != "done"
        ],
        "mean_train_ms": round(sum(task.train_ms for task in done) / len(done), 2) if done else None,
    }


def run_line(run: RunRow, rounds_done: int) -> dict[str, Any]:
    return {
        "id": run.id,
        "name": run.name,
        "state": run.state,
        "rounds": f"{rounds_done}/{run.rounds_total}",
        "dataset": run.config.get("dataset"),
        "model": run.config.get("model"),
        "created_at": run.created_at,
    }
