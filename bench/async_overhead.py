"""Buffered async's scheduler overhead: updates folded per wall second against a sync round's device rate.

    .venv/bin/python bench/async_overhead.py [--updates 600] [--concurrency 50] [--buffer 10] [--repeat 2]

Both run on one local cluster (embedded Redis, one worker process per core) in the same run,
with devices that train (almost) nothing (noop_plugin), so what is timed is fedqueue's own work:

- sync: FedAvg rounds of `concurrency` devices until `updates` devices trained;
- fedbuff: `concurrency` devices training at once, a version every `buffer` folded updates,
  until `updates` updates are folded: each stored result asks for a fold pass, which takes the
  arrivals in simulated order, makes versions, refills slots and saves the schedule.

Each rate is updates over the span from the first round's (version's) enqueue to the last
aggregation. `--repeat N` alternates the order. Target: sync's rate at most 1.2x fedbuff's.
Also printed: CPU milliseconds per update, of the benchmark and every process under it (workers,
Redis) from submit to the run's end. It shows the scheduler's own cost even where other work
on the machine disturbs the rates.
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

from common import (  # noqa: E402
    BENCH_DIR,
    ForeignLoad,
    machine,
    machine_line,
    markdown_table,
    tree_cpu_s,
    verdict,
    wait_for_quiet,
    wait_run,
)

from fedqueue.config import Settings  # noqa: E402
from fedqueue.fl.store.results import list_rounds  # noqa: E402

TARGET = 1.2


def configs(updates: int, concurrency: int, buffer: int) -> dict[str, dict[str, Any]]:
    from noop_plugin import CONFIG

    common = {**CONFIG, "num_devices": max(2 * concurrency, 100), "devices_per_round": concurrency}
    return {
        "sync": {**common, "name": "async-overhead-sync", "rounds": updates // concurrency},
        "fedbuff": {
            **common,
            "name": "async-overhead-fedbuff",
            "mode": "fedbuff",
            "concurrency": concurrency,
            "buffer_size": buffer,
            "max_model_version": updates // buffer,
        },
    }


def rate(handle: Any, cluster: Any, cpu_before: float) -> dict[str, float]:
    status = wait_run(handle, cluster)
    cpu_s = tree_cpu_s() - cpu_before
    if status["state"] != "finished":
        raise RuntimeError(f"run ended {status['state']}: {status['error']}")
    rounds = list_rounds(handle.store, handle.id)
    done = [row for row in rounds if row.aggregated_at is not None]
    span = max(row.aggregated_at for row in done) - rounds[0].enqueued_at
    # FedBuff counts the updates its versions folded; sync every device of an aggregated round.
    counted = status["buffered"]["folded"] if "buffered" in status else sum(len(row.selected) for row in done)
    return {
        "updates": counted,
        "span_s": span,
        "per_s": counted / span,
        "trained": status["tasks_done"],
        "cpu_ms": 1000 * cpu_s / counted,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--updates", type=int, default=600)
    parser.add_argument("--concurrency", type=int, default=50)
    parser.add_argument("--buffer", type=int, default=10)
    parser.add_argument("--procs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument(
        "--busy-ok", action="store_true", help="start at once on a busy machine (the CPU figures still hold)"
    )
    args = parser.parse_args()
    import fedqueue

    print(machine_line(machine()))
    if not args.busy_ok:
        wait_for_quiet()
    load = ForeignLoad()
    runs = configs(args.updates, args.concurrency, args.buffer)
    results: dict[str, list[dict[str, float]]] = {way: [] for way in runs}
    with tempfile.TemporaryDirectory(prefix="fedqueue-bench-") as tmp:
        settings = Settings(database_url=f"sqlite:///{Path(tmp) / 'async.db'}", key_prefix="bench-async-overhead")
        with fedqueue.local_cluster(procs=args.procs, settings=settings.with_plugin_path([str(BENCH_DIR)])) as cluster:
            for config in runs.values():  # warm-up: imports, caches, the first fold pass
                wait_run(
                    fedqueue.submit({**config, "rounds": 2, "max_model_version": 2}, settings=cluster.settings), cluster
                )
            for repeat in range(args.repeat):
                order = list(runs) if repeat % 2 == 0 else list(reversed(runs))
                for way in order:
                    cpu_before = tree_cpu_s()
                    handle = fedqueue.submit(runs[way], settings=cluster.settings)
                    results[way].append(rate(handle, cluster, cpu_before))
    rows = []
    for way, measured in results.items():
        rows.append(
            [
                way,
                int(statistics.mean(m["updates"] for m in measured)),
                int(statistics.mean(m["trained"] for m in measured)),
                f"{statistics.mean(m['span_s'] for m in measured):.2f}",
                " / ".join(f"{m['per_s']:.0f}" for m in measured),
                f"{statistics.mean(m['per_s'] for m in measured):.0f}",
                f"{statistics.mean(m['cpu_ms'] for m in measured):.2f}",
            ]
        )
    sync_rate = statistics.mean(m["per_s"] for m in results["sync"])
    async_rate = statistics.mean(m["per_s"] for m in results["fedbuff"])
    print(
        f"\n{args.updates} updates, {args.concurrency} devices at once, buffer {args.buffer}, "
        f"{args.procs} worker processes, {args.repeat} runs each\n"
    )
    headers = ["way", "updates aggregated", "device tasks", "span s", "updates/s per run", "updates/s", "CPU ms/update"]
    print(markdown_table(headers, rows))
    ratio = sync_rate / async_rate
    print(f"\nsync / fedbuff: {ratio:.2f}x (target <= {TARGET}x) {verdict(ratio <= TARGET)}")
    cpu = {way: statistics.mean(m["cpu_ms"] for m in measured) for way, measured in results.items()}
    print(f"CPU per update, fedbuff / sync: {cpu['fedbuff'] / cpu['sync']:.2f}x")
    print(load.report())


if __name__ == "__main__":
    main()
