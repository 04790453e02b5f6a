"""What an FL run did, from the store: rounds, accuracy, device failures, packing, a buffered-async run's updates.

The core's status of a run (`fedqueue.report.summary.run_summary`) and `fedqueue runs` get these through the FL
kind's hooks (`JobKind.summary`, `JobKind.run_columns`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

from fedqueue.fl.store.results import DeviceOutcome, device_outcomes, list_rounds, round_rows_for
from fedqueue.fl.store.schedule_rows import get_schedule
from fedqueue.fl.store.schema import RoundRow
from fedqueue.fl.store.stop_rows import get_stop
from fedqueue.fl.strategy.mode import Mode
from fedqueue.fl.strategy.modes import MODES
from fedqueue.report.timeline import Span
from fedqueue.store import Store
from fedqueue.store.schema import RunRow


def run_status(store: Store, run: RunRow, spans: Sequence[Span]) -> dict[str, Any]:
    """The FL keys of a run's status; its device tasks are counted from their results, not their timings."""
    rounds = list_rounds(store, run.id)
    results = device_outcomes(store, run.id)
    trained = [span for span in spans if span.state == "done" and span.task_type == "train"]
    return {
        "rounds_total": run.rounds_total,
        "rounds_done": sum(1 for row in rounds if row.state == "done"),
        "tasks_done": sum(1 for result in results if result.state == "done"),
        "tasks_failed": sum(1 for result in results if result.state != "done"),
        "accuracy": {str(row.round_index): row.accuracy for row in rounds if row.accuracy is not None},
        "loss": {str(row.round_index): row.loss for row in rounds if row.loss is not None},
        "final_accuracy": next((row.accuracy for row in reversed(rounds) if row.accuracy is not None), None),
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
        "simulated_speeds": simulated_speeds(run),
        "sim_time": {str(row.round_index): round(row.sim_time, 3) for row in rounds if row.sim_time is not None},
        **packing_of(run),
        **buffered_of(run, results),
        **stop_of(store, run, rounds),
    }


def stop_of(store: Store, run: RunRow, rounds: Sequence[RoundRow]) -> dict[str, Any]:
    """Why the run ended (its stop rule's line), and with max_sim_time the simulated time used and left."""
    stop = get_stop(store, run.id)
    found: dict[str, Any] = {"stop": None if stop is None else stop.reason}
    limit = run.config.get("max_sim_time")
    if limit is not None:
        used = _sim_time_used(store, run, rounds)
        found["sim_budget"] = {"max": limit, "used": round(used, 3), "left": round(max(0.0, limit - used), 3)}
    return found


def _sim_time_used(store: Store, run: RunRow, rounds: Sequence[RoundRow]) -> float:
    """A buffered run's clock stands at its last arrival taken; a synchronous run's at its last round's end."""
    if mode_of(run).asynchronous:
        schedule = get_schedule(store, run.id)
        if schedule is not None:
            return float(schedule.state.get("now", 0.0))
    return max((row.sim_time for row in rounds if row.state == "done" and row.sim_time is not None), default=0.0)


def run_columns(store: Store, runs: Sequence[RunRow]) -> dict[str, dict[str, Any]]:
    """`fedqueue runs` columns of FL runs: the mode (or a sync run's own aggregation), rounds or versions made and
    the bound they run to, the latest accuracy, dataset and model."""
    rounds = round_rows_for(store, [run.id for run in runs])
    columns: dict[str, dict[str, Any]] = {}
    for run in runs:
        done = [row for row in rounds[run.id] if row.state == "done"]
        scored = [row for row in done if row.accuracy is not None]
        columns[run.id] = {
            # No total: a buffered run bounded by max_sim_time alone.
            "rounds": f"{len(done)}/{run.rounds_total}" if run.rounds_total else str(len(done)),
            "type": run_type(run.config),
            "progress": progress(run, len(done)),
            "accuracy": max(scored, key=lambda row: row.round_index).accuracy if scored else None,
            "dataset": run.config.get("dataset"),
            "model": run.config.get("model"),
        }
    return columns


def run_type(config: dict[str, Any]) -> str:
    """fedavg, fedbuff or fedrevive; a synchronous run with an aggregation of its own is named by it."""
    mode = MODES[str(config.get("mode", "fedavg"))]
    aggregate = str(config.get("aggregate", "fedavg"))
    if not mode.takes_aggregate or aggregate == "fedavg":
        return mode.name
    return aggregate.rsplit(":", 1)[-1].rsplit(".", 1)[-1]  # a plugin by its own name, not its module's


def progress(run: RunRow, made: int) -> str:
    """Rounds or versions made of those the run makes ("7/10 rounds", "312/500 v"). Under max_sim_time, the
    simulated time it ends at: a buffered run's version bound is then a ceiling it is not meant to reach, so
    only its count is shown ("471 v · t≤200"); a sync run keeps its rounds ("7/10 r · t≤200")."""
    mode = mode_of(run)
    count = f"{made}/{run.rounds_total}" if run.rounds_total else str(made)
    limit = run.config.get("max_sim_time")
    if limit is None:
        return f"{count} {mode.unit.counted}"
    return f"{made if mode.asynchronous else count} {mode.unit.short} · t≤{limit:g}"


def simulated_speeds(run: RunRow) -> bool:
    """The run's config gives its devices speeds or delays: its rounds take simulated time."""
    return bool(
        run.config.get("device_speed")
        or run.config.get("communication_delay")
        or run.config.get("clock", "per_sample") != "per_sample"
    )


def models_sim_time(run: RunRow) -> bool:
    """Simulated time means something in this run: a buffered-async one, or one given device speeds."""
    return mode_of(run).asynchronous or simulated_speeds(run)


def mode_of(run: RunRow) -> Mode:
    """What the views may know of the strategy that ran a run, as its stored config names it."""
    return MODES[str(run.config.get("mode", "fedavg"))]


def buffered_of(run: RunRow, results: Iterable[DeviceOutcome]) -> dict[str, Any]:
    """A buffered-async run's updates: how many were folded, dropped as stale or failed, and their staleness."""
    if not mode_of(run).asynchronous:
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
    """How an FL run's devices were packed into tasks, as its stored config says."""
    if "pack_size" not in run.config:
        return {}
    packing = {"pack_size": run.config["pack_size"], "pack_mode": run.config.get("pack_mode", "sequential")}
    if run.config.get("pack_choice"):
        packing["chosen"] = run.config["pack_choice"]
    return {"packing": packing}
