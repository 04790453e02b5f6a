"""Sync FedAvg against buffered async (FedBuff) in simulated time, on devices of mixed speed.

    .venv/bin/python bench/sync_vs_async.py [--config examples/digits_fedbuff.toml] [--seeds 0 1 2]

One config, run twice per seed on one local cluster: as written (`mode = "fedbuff"`) and with
`mode = "fedavg"` (its `rounds` of `devices_per_round`). Both use the same devices, speed
classes and delays, so their simulated clocks compare: a synchronous round lasts as long as
its slowest selected device; an async version is made when its buffer fills.

For each: the final accuracy, the simulated time of the last version, the simulated time
at which the run first reaches the sync run's final accuracy (the target), and wall time.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import REPO, ForeignLoad, machine, machine_line, markdown_table, wait_for_quiet, wait_run  # noqa: E402

from fedqueue.config import Settings  # noqa: E402
from fedqueue.fl.config import load_run_config  # noqa: E402
from fedqueue.fl.store.results import list_rounds  # noqa: E402


def curve(handle: Any) -> list[tuple[float, float]]:
    """(simulated time, accuracy) of each evaluated version."""
    rows = list_rounds(handle.store, handle.id)
    return [(row.sim_time, row.accuracy) for row in rows if row.accuracy is not None and row.sim_time is not None]


def reached(points: list[tuple[float, float]], target: float) -> float | None:
    return next((sim for sim, accuracy in points if accuracy >= target - 1e-9), None)


def draw(path: Path, curves: dict[str, list[tuple[float, float]]], target: float, seed: int) -> None:
    from matplotlib.figure import Figure

    figure = Figure(figsize=(8, 3.6), dpi=110, layout="constrained")
    ax = figure.subplots()
    labels = {
        "fedavg": "sync FedAvg (a round waits for its slowest device)",
        "fedbuff": "FedBuff (buffer of 10)",
        "fedrevive": "FedRevive (FedBuff + distillation, 10 % held out)",
    }
    for mode, points in curves.items():
        ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", markersize=3, label=labels[mode])
    ax.axhline(target, color="0.6", linestyle=":", label=f"target: sync's final accuracy {target:.4f}")
    ax.set_xlabel("simulated time (s)")
    ax.set_ylabel("accuracy (held out)")
    ax.set_title(f"digits, 100 devices of three speeds, seed {seed}", loc="left", fontsize=10)
    ax.grid(color="0.9")
    ax.legend(fontsize=8, frameon=False, loc="lower right")
    figure.savefig(path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=str(REPO / "examples" / "digits_fedbuff.toml"))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--procs", type=int, default=os.cpu_count() or 1)
    parser.add_argument(
        "--modes", nargs="+", default=["fedavg", "fedbuff"], help="fedavg first (its accuracy is the target)"
    )
    parser.add_argument("--plot", type=Path, help="draw the first seed's accuracy against simulated time here (PNG)")
    args = parser.parse_args()
    import fedqueue

    print(machine_line(machine()))
    wait_for_quiet()
    load = ForeignLoad()
    rows = []
    gains = []
    with tempfile.TemporaryDirectory(prefix="fedqueue-bench-") as tmp:
        settings = Settings(database_url=f"sqlite:///{Path(tmp) / 'sync_async.db'}", key_prefix="bench-sync-async")
        with fedqueue.local_cluster(procs=args.procs, settings=settings) as cluster:
            for seed in args.seeds:
                found: dict[str, dict[str, Any]] = {}
                for mode in args.modes:
                    config = load_run_config(args.config, {"mode": mode, "seed": seed})
                    handle = fedqueue.submit(config, settings=cluster.settings)
                    status = wait_run(handle, cluster)
                    if status["state"] != "finished":
                        raise RuntimeError(f"{mode} seed {seed} ended {status['state']}: {status['error']}")
                    points = curve(handle)
                    found[mode] = {"status": status, "points": points, "end": points[-1][0]}
                target = found[args.modes[0]]["status"]["final_accuracy"]
                for mode, result in found.items():
                    status, points = result["status"], result["points"]
                    at = reached(points, target)
                    result["at"] = at
                    rows.append(
                        [
                            f"{mode}, seed {seed}",
                            len(points),
                            f"{status['final_accuracy']:.4f}",
                            f"{result['end']:.1f}",
                            "not reached" if at is None else f"{at:.1f}",
                            f"{status['wall_s']:.2f}",
                            status["tasks_done"],
                        ]
                    )
                if args.plot is not None and seed == args.seeds[0]:
                    draw(args.plot, {mode: result["points"] for mode, result in found.items()}, target, seed)
                sync_at, async_at = found[args.modes[0]]["at"], found[args.modes[1]]["at"]
                if sync_at is not None and async_at is not None:
                    gains.append(sync_at / async_at)
    shown = Path(args.config).resolve()
    shown_name = shown.relative_to(REPO) if shown.is_relative_to(REPO) else shown.name
    print(f"\n{shown_name}, {args.procs} worker processes; target = the sync run's final accuracy\n")
    headers = ["run", "versions", "final accuracy", "sim s (end)", "sim s to target", "wall s", "device tasks"]
    print(markdown_table(headers, rows))
    if gains:
        print(
            f"\nsimulated time to the target, sync / async: {' / '.join(f'{g:.2f}x' for g in gains)}"
            f" (median {statistics.median(gains):.2f}x)"
        )
    print(load.report())


if __name__ == "__main__":
    main()
