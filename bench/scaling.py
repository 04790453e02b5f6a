"""Scheduler cost as the round grows: 100, 1,000 and 10,000 selected devices of a no-op task.

    .venv/bin/python bench/scaling.py [--sizes 100 1000 10000] [--procs N]

Part 1 runs the scheduler's own steps in this process, on a real Redis (embedded) and a
real SQLite store, so they can be timed and their peak memory read:
  submit   - plan the round, publish the model, record it, enqueue one message per device;
  store    - the result write each worker makes per task (it returns the round's count of
             stored results, which tells the worker whether it stored the last one);
  finish   - aggregate the round's N updates, evaluate, checkpoint, close the run.
Workers' update blobs are written straight into Redis in between (not timed).
Peak memory is the rise of this process's resident set (VmHWM, reset before each step).

Part 2 runs the same rounds end to end through real workers (one process per core).
"""

from __future__ import annotations

import argparse
import gc
import os
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (  # noqa: E402
    BENCH_DIR,
    ForeignLoad,
    RssWatcher,
    machine,
    machine_line,
    markdown_table,
    wait_for_quiet,
    wait_run,
)

from fedqueue.config import Settings  # noqa: E402

MiB = 1024 * 1024
FLAT = 2.0  # per-task numbers within 2x of the smallest round count as flat


def noop_config(devices: int) -> dict[str, Any]:
    from noop_plugin import CONFIG

    return {**CONFIG, "name": f"scaling-{devices}", "num_devices": devices, "devices_per_round": devices, "rounds": 1}


def _status_kib(field: str) -> int:
    match = re.search(rf"^{field}:\s+(\d+) kB", Path("/proc/self/status").read_text(), re.MULTILINE)
    return int(match.group(1)) if match else 0


class PeakMemory:
    """Rise of this process's peak resident set during a block (Linux: VmHWM, reset via clear_refs)."""

    def __enter__(self) -> PeakMemory:
        gc.collect()
        Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current RSS
        self._base = _status_kib("VmRSS")
        self.bytes = 0
        return self

    def __exit__(self, *exc: object) -> None:
        self.bytes = max(0, _status_kib("VmHWM") - self._base) * 1024


def scheduler_steps(url: str, folder: Path, devices: int) -> dict[str, float]:
    from fedqueue.fl.config import RunConfig
    from fedqueue.fl.messages import device_task_name, update_key
    from fedqueue.fl.ml.weights import encode_state
    from fedqueue.fl.scheduler import submit_run
    from fedqueue.fl.store.results import DeviceResult, get_round, record_device_result
    from fedqueue.fl.strategy.common import final_state
    from fedqueue.fl.strategy.sync.rounds import aggregate_round
    from fedqueue.queue.client import open_client_services
    from fedqueue.store.repo import TaskTiming

    settings = Settings(
        broker_url=url,
        database_url=f"sqlite:///{folder / f'scheduler-{devices}.db'}",
        key_prefix=f"bench-scaling-{devices}",
    ).with_plugin_path([str(BENCH_DIR)])
    services = open_client_services(settings)
    config = RunConfig.from_dict(noop_config(devices))
    submit_run(services, RunConfig.from_dict(noop_config(10)))  # imports and caches, not timed

    with PeakMemory() as submit_memory:
        began = time.perf_counter()
        run_id = submit_run(services, config)
        submit_s = time.perf_counter() - began
    # What the workers would store: one update blob and one result row per device.
    update = encode_state(final_state(services.store, run_id))
    row = get_round(services.store, run_id, 1)
    assert row is not None
    now = time.time()
    store_s = 0.0  # the store write each worker makes per task, which also tells it whether it was last
    for device in row.selected:
        ref = services.blobs.put(update_key(run_id, 1, device), update)
        began = time.perf_counter()
        record_device_result(
            services.store,
            DeviceResult(
                run_id=run_id,
                round_index=1,
                device=device,
                state="done",
                worker="bench@local",
                attempt=1,
                samples=1,
                loss=0.5,
                update_key=ref.key,
                update_sha256=ref.sha256,
                update_nbytes=ref.nbytes,
            ),
            TaskTiming(
                run_id=run_id,
                kind="fl",
                task_type="train",
                task=device_task_name(1, device),
                round_index=1,
                state="done",
                worker="bench@local",
                device_used="cpu",
                attempt=1,
                enqueued_at=now,
                started_at=now,
                finished_at=now,
            ),
        )
        store_s += time.perf_counter() - began
    check_s = store_s / devices

    with PeakMemory() as finish_memory:
        began = time.perf_counter()
        aggregate_round(services, run_id, 1, "bench@local")
        finish_s = time.perf_counter() - began
    if services.store.get_run(run_id).state != "finished":
        raise RuntimeError(f"scheduler run for {devices} devices did not finish")
    services.ledger.redis.delete(f"{settings.key_prefix}:{settings.queue('devices')}")  # no worker reads this queue
    services.close()
    return {
        "submit_s": submit_s,
        "submit_bytes": submit_memory.bytes,
        "check_s": check_s,
        "finish_s": finish_s,
        "finish_bytes": finish_memory.bytes,
    }


def through_workers(sizes: list[int], procs: int, folder: Path) -> dict[int, dict[str, float]]:
    import fedqueue
    from fedqueue.fl.store.results import list_rounds
    from fedqueue.report import build_report

    settings = Settings(database_url=f"sqlite:///{folder / 'workers.db'}", key_prefix="bench-scaling-e2e")
    settings = settings.with_plugin_path([str(BENCH_DIR)])
    results: dict[int, dict[str, float]] = {}
    with fedqueue.local_cluster(procs=procs, settings=settings) as cluster:
        wait_run(fedqueue.submit(noop_config(100), settings=cluster.settings), cluster)  # warm-up
        pids = [process.pid for process in cluster.workers.processes]
        for devices in sizes:
            with RssWatcher(pids) as memory:
                handle = fedqueue.submit(noop_config(devices), settings=cluster.settings)
                status = wait_run(handle, cluster)
            if status["state"] != "finished" or status["tasks_done"] != devices:
                raise RuntimeError(f"{devices}-device run ended {status['state']} with {status['tasks_done']} tasks")
            row = list_rounds(handle.store, handle.id)[0]
            assert row.aggregated_at is not None
            report = build_report(handle.store, handle.id)
            results[devices] = {
                "round_s": row.aggregated_at - row.enqueued_at,
                "tasks_per_s": devices / (row.aggregated_at - row.enqueued_at),
                "aggregate_s": (row.aggregate_ms or 0.0) / 1000,
                "between_ms": report["time"]["between_tasks_mean_ms"] or 0.0,
                "efficiency": report["parallel_efficiency"] or 0.0,
                "worker_peak_bytes": memory.peak_bytes,
                "worker_rise_bytes": memory.peak_bytes - memory.base_bytes,
            }
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[100, 1000, 10000])
    parser.add_argument("--procs", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args()
    from fedqueue.queue.embedded import EmbeddedRedis

    print(machine_line(machine()))
    wait_for_quiet()
    load = ForeignLoad()
    with EmbeddedRedis() as broker, tempfile.TemporaryDirectory(prefix="fedqueue-bench-") as tmp:
        steps = {devices: scheduler_steps(broker.url, Path(tmp), devices) for devices in args.sizes}
        workers = through_workers(args.sizes, args.procs, Path(tmp))
    print_results(args, steps, workers, load.report())


def print_results(
    args: argparse.Namespace, steps: dict[int, dict[str, float]], workers: dict[int, dict[str, float]], foreign: str
) -> None:
    print("\n### Scheduler steps in one process (real Redis and SQLite), no-op device task\n")
    rows = []
    for devices, s in steps.items():
        rows.append(
            (
                f"{devices:,}",
                f"{1000 * s['submit_s']:.0f}",
                f"{1e6 * s['submit_s'] / devices:.0f}",
                f"{s['submit_bytes'] / MiB:.1f}",
                f"{s['submit_bytes'] / devices:.0f}",
                f"{1e6 * s['check_s']:.0f}",
                f"{1000 * s['finish_s']:.0f}",
                f"{1e6 * s['finish_s'] / devices:.0f}",
                f"{s['finish_bytes'] / MiB:.1f}",
                f"{s['finish_bytes'] / devices:.0f}",
            )
        )
    print(
        markdown_table(
            [
                "devices",
                "submit ms",
                "µs/task",
                "submit peak MiB",
                "B/task",
                "result write + round count µs (per task)",
                "aggregate ms",
                "µs/task",
                "aggregate peak MiB",
                "B/task",
            ],
            rows,
        )
    )
    smallest, largest = min(steps), max(steps)

    def flat(key: str, per_task: bool = True) -> str:
        low = steps[smallest][key] / (smallest if per_task else 1)
        high = steps[largest][key] / (largest if per_task else 1)
        grows = high / low if low else float("inf")
        return f"{grows:.2f}x from {smallest:,} to {largest:,} ({'flat' if grows <= FLAT else 'GROWS'})"

    print(
        f"\nper task, submit time: {flat('submit_s')}; aggregation time: {flat('finish_s')};"
        f" result write (with the round's count) per task: {flat('check_s', per_task=False)}"
    )
    low, high = steps[smallest], steps[largest]
    print(
        f"peak memory: submit {low['submit_bytes'] / MiB:.1f} -> {high['submit_bytes'] / MiB:.1f} MiB,"
        f" aggregation {low['finish_bytes'] / MiB:.1f} -> {high['finish_bytes'] / MiB:.1f} MiB"
        f" (per task: {flat('finish_bytes')})"
    )
    print(f"\n### The same rounds through {args.procs} worker processes\n")
    print(
        markdown_table(
            [
                "devices",
                "round s",
                "tasks/s",
                "aggregation s",
                "between tasks ms",
                "parallel efficiency",
                "worker peak RSS MiB",
                "rise during the round MiB",
            ],
            [
                (
                    f"{devices:,}",
                    f"{w['round_s']:.2f}",
                    f"{w['tasks_per_s']:.0f}",
                    f"{w['aggregate_s']:.2f}",
                    f"{w['between_ms']:.1f}",
                    f"{100 * w['efficiency']:.1f} %",
                    f"{w['worker_peak_bytes'] / MiB:.0f}",
                    f"{w['worker_rise_bytes'] / MiB:.1f}",
                )
                for devices, w in workers.items()
            ],
        )
    )
    print(foreign)


if __name__ == "__main__":
    main()
