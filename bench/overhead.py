"""Per-task overhead: fedqueue device tasks that train nothing against raw Celery no-op tasks.

    .venv/bin/python bench/overhead.py [--tasks 2000] [--procs N]

Both run on the same embedded Redis in the same run, with the same number of
`celery worker -P threads -c 1` processes and the same Celery settings (JSON, late
acks, prefetch 1, task events). Two rates each:

- round: tasks enqueued while the workers consume (what a round does), timed from the
  first enqueue until the queue is empty and nothing is left unacknowledged;
- drain: every message already queued (consumers paused, then resumed), which leaves out
  the enqueueing process and measures the workers alone.

Then one fedqueue task is taken apart in this process (same Redis, SQLite store) to show
where its time goes: enqueue, store writes and reads, blob reads and writes, training.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (  # noqa: E402
    BENCH_DIR,
    ForeignLoad,
    Timers,
    celery_workers,
    check_workers,
    machine,
    machine_line,
    markdown_table,
    verdict,
    wait_for_quiet,
    wait_run,
)

import fedqueue  # noqa: E402
from fedqueue.config import Settings  # noqa: E402
from fedqueue.queue.embedded import EmbeddedRedis  # noqa: E402

TARGET_RATIO = 0.70
RAW_QUEUE = "bench.raw"


def noop_config(devices: int) -> dict[str, Any]:
    from noop_plugin import CONFIG

    return {**CONFIG, "name": f"overhead-{devices}", "num_devices": devices, "devices_per_round": devices, "rounds": 1}


def last_trained(handle: Any) -> float:
    """When the run's last device task finished."""
    return max(t.finished_at for t in handle.store.task_timings(handle.id) if t.task_type == "train")


def wait_drained(
    client: redis.Redis,
    queue_key: str,
    unacked_key: str,
    timeout_s: float = 600,
    alive: Callable[[], None] = lambda: None,
) -> float:
    """UNIX time at which the queue is empty and no message is unacknowledged (acks come after the task)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        alive()
        with client.pipeline() as pipe:
            pipe.llen(queue_key)
            pipe.hlen(unacked_key)
            queued, unacked = pipe.execute()
        if queued == 0 and unacked == 0:
            return time.time()
        time.sleep(0.005)
    raise TimeoutError(f"{queue_key} not drained within {timeout_s} s")


def measure_raw(url: str, client: redis.Redis, procs: int, tasks: int) -> dict[str, float]:
    os.environ["BENCH_BROKER_URL"] = url
    os.environ["BENCH_QUEUE"] = RAW_QUEUE
    import raw_celery_app as raw

    queue_key, unacked_key = f"{RAW_QUEUE}:{RAW_QUEUE}", f"{RAW_QUEUE}:unacked"
    # Shaped like a fedqueue device message, so both carry the same bytes.
    message = {
        "run_id": "0" * 12,
        "round_index": 1,
        "device": 0,
        "enqueued_at": time.time(),
        "model": {"key": "0" * 12 + "/global/0", "sha256": "0" * 64, "nbytes": 0},
    }

    def send(count: int) -> float:
        began = time.time()
        with raw.app.producer_or_acquire() as producer:
            for device in range(count):
                raw.app.send_task(raw.NOOP, args=[{**message, "device": device}], queue=RAW_QUEUE, producer=producer)
        return began

    env = {"PYTHONPATH": str(BENCH_DIR), "BENCH_BROKER_URL": url, "BENCH_QUEUE": RAW_QUEUE}
    names = [f"raw{index}" for index in range(procs)]
    with celery_workers("raw_celery_app:app", names, RAW_QUEUE, env, _pinger(raw.app)):
        send(200)
        wait_drained(client, queue_key, unacked_key)
        began = send(tasks)
        round_s = wait_drained(client, queue_key, unacked_key) - began
        raw.app.control.cancel_consumer(RAW_QUEUE, reply=True, timeout=2)
        send(tasks)
        began = time.time()
        raw.app.control.add_consumer(RAW_QUEUE, reply=True, timeout=2)
        drain_s = wait_drained(client, queue_key, unacked_key) - began
    raw.app.close()
    return {"round_rate": tasks / round_s, "drain_rate": tasks / drain_s}


def _pinger(app: Any) -> Callable[[], int]:
    return lambda: len(app.control.ping(timeout=0.5) or [])


def measure_fedqueue(url: str, client: redis.Redis, procs: int, tasks: int, folder: Path) -> dict[str, Any]:
    from fedqueue.fl.store.results import list_rounds
    from fedqueue.queue.app import make_app
    from fedqueue.report import build_report

    settings = Settings(
        broker_url=url, database_url=f"sqlite:///{folder / 'overhead.db'}", key_prefix="bench-overhead"
    ).with_plugin_path([str(BENCH_DIR)])
    prefix = settings.key_prefix
    queue_key, unacked_key = f"{prefix}:{settings.queue('devices')}", f"{prefix}:unacked"
    with fedqueue.local_cluster(procs=procs, settings=settings) as cluster:
        control = make_app(cluster.settings).control
        alive = lambda: check_workers(cluster)  # noqa: E731
        wait_run(fedqueue.submit(noop_config(200), settings=cluster.settings), cluster)  # warm-up
        handle = fedqueue.submit(noop_config(tasks), settings=cluster.settings)
        done_at = wait_drained(client, queue_key, unacked_key, alive=alive)
        wait_run(handle, cluster)
        enqueued_at = list_rounds(handle.store, handle.id)[0].enqueued_at
        round_report = build_report(handle.store, handle.id)

        control.cancel_consumer(settings.queue("devices"), reply=True, timeout=2)
        paused = fedqueue.submit(noop_config(tasks), settings=cluster.settings)
        began = time.time()
        control.add_consumer(settings.queue("devices"), reply=True, timeout=2)
        drained_at = wait_drained(client, queue_key, unacked_key, alive=alive)
        wait_run(paused, cluster)
        drain_report = build_report(paused.store, paused.id)
        last_finish = last_trained(paused)
        tasks_last = last_trained(handle)
    for report in (round_report, drain_report):
        trained = report["tasks_by_type"].get("train", {}).get("done", 0)
        if report["state"] != "finished" or trained != tasks:
            raise RuntimeError(f"fedqueue run {report['id']} ended {report['state']} with {trained} device tasks")
    return {
        "round_rate": tasks / (done_at - enqueued_at),
        "round_rate_tasks_only": tasks / (tasks_last - enqueued_at),
        "drain_rate": tasks / (drained_at - began),
        "drain_rate_tasks_only": tasks / (last_finish - began),
        "aggregation_s": drain_report["time"]["aggregation_s"] + drain_report["time"]["evaluation_s"],
        "between_tasks_ms": drain_report["time"]["between_tasks_mean_ms"],
        "task_busy_ms": 1000 * drain_report["task_busy_s"] / tasks,
        "retried": round_report["tasks_retried"] + drain_report["tasks_retried"],
        "efficiency": drain_report["parallel_efficiency"],
    }


# (owner, attribute, label): the leaves of one device task, timed without nesting.
def _timed_parts() -> list[tuple[Any, str, str]]:
    import fedqueue.fl.ml.data as data
    import fedqueue.fl.ml.models as models
    import fedqueue.fl.ml.train as train
    import fedqueue.fl.setup as setup
    import fedqueue.fl.strategy.sync.strategy as synchronous
    import fedqueue.fl.worker.device_task as device_task
    from fedqueue.core.broker.ledger import RedisLedger
    from fedqueue.core.broker.spilling import SpillingBlobStore

    return [
        (RedisLedger, "start_attempt", "attempt count + running mark (one Redis transaction)"),
        (device_task, "unstored_devices", "duplicate check (SQL SELECT)"),
        (device_task.WorkerCache, "run_config", "run config (cached per worker)"),
        (SpillingBlobStore, "get", "global model blob read (once per worker and version)"),
        (data, "device_data", "device data (cached per worker)"),
        (data, "load_federated", "dataset (cached per worker)"),
        (models, "build_model", "build model (once per slot and run)"),
        (setup, "resolve_plugins", "resolve plugins"),
        (train, "train_local", "local training (1 step)"),
        (device_task, "encode_state", "encode update (safetensors)"),
        (SpillingBlobStore, "put", "update blob write (Redis SET)"),
        (device_task, "record_device_results", "result write + round's stored count (SQL INSERT, UPDATE, commit)"),
        (synchronous, "tail_started", "tail check (Redis LLEN of the device queue)"),
    ]


def breakdown(url: str, folder: Path, tasks: int) -> dict[str, Any]:
    """One device task's parts, timed in this process: the Celery task body without Celery."""
    import fedqueue.fl.strategy.sync.strategy as synchronous
    from fedqueue.fl.config import RunConfig
    from fedqueue.fl.messages import DeviceTask
    from fedqueue.fl.ml.torch_device import configure_determinism
    from fedqueue.fl.ml.warmup import warm_up
    from fedqueue.fl.scheduler import submit_run
    from fedqueue.fl.strategy.sync.rounds import aggregate_round
    from fedqueue.fl.strategy.sync.strategy import SYNCHRONOUS
    from fedqueue.fl.worker.cache import WorkerCache
    from fedqueue.fl.worker.device_task import run_device_task
    from fedqueue.queue.client import open_client_services

    settings = Settings(
        broker_url=url, database_url=f"sqlite:///{folder / 'breakdown.db'}", key_prefix="bench-breakdown"
    ).with_plugin_path([str(BENCH_DIR)])
    configure_determinism(1)
    warm_up()
    services = open_client_services(settings)
    captured: list[DeviceTask] = []
    publish = services.enqueue
    enqueue_s = 0.0

    def enqueue(batch: Any) -> None:
        nonlocal enqueue_s
        began = time.perf_counter()
        publish(batch)  # the real Celery publish, to a queue no worker reads
        enqueue_s += time.perf_counter() - began
        captured.extend(batch)

    services.enqueue = enqueue
    config = RunConfig.from_dict(noop_config(tasks))
    run_id = submit_run(services, config)
    messages = [json.loads(json.dumps(task.to_dict())) for task in captured]  # as the queue delivers them
    cache = WorkerCache()  # one for the whole run, as a worker process keeps one
    timers = Timers()
    for owner, attribute, label in _timed_parts():
        timers.wrap(owner, attribute, label)
    # The last task would enqueue the round's aggregation; here it is timed apart, after the loop.
    request_aggregation = synchronous.request_aggregation
    synchronous.request_aggregation = lambda *args: True
    began = time.perf_counter()
    try:
        for message in messages:
            task = DeviceTask.from_dict(message)
            attempt = services.ledger.start_attempt(task.attempt_key, "bench@local")
            with services.ledger.heartbeat(task.attempt_key, "bench@local"):
                run_device_task(services, cache, task, "bench@local", attempt, SYNCHRONOUS)
    finally:
        total_s = time.perf_counter() - began
        timers.restore()
        synchronous.request_aggregation = request_aggregation
    began = time.perf_counter()
    aggregate_round(services, run_id, 1, "bench@local")
    aggregation_s = time.perf_counter() - began
    if services.store.get_run(run_id).state != "finished":
        raise RuntimeError("in-process breakdown run did not finish")
    per_task_s = total_s / tasks
    parts = {label: value / tasks for label, value in timers.seconds.items()}
    parts["other (message decode, load_state_dict, seeds, timing)"] = per_task_s - sum(parts.values())
    services.ledger.redis.delete(f"{settings.key_prefix}:{settings.queue('devices')}")
    services.close()
    return {
        "parts": parts,
        "per_task_s": per_task_s,
        "enqueue_per_task_s": enqueue_s / tasks,
        "aggregation_s": aggregation_s,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=2000)
    parser.add_argument("--procs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--breakdown-tasks", type=int, default=500)
    args = parser.parse_args()
    print(machine_line(machine()))
    wait_for_quiet()
    load = ForeignLoad()
    with EmbeddedRedis() as broker, tempfile.TemporaryDirectory(prefix="fedqueue-bench-") as tmp:
        client = redis.Redis.from_url(broker.url)
        raw = measure_raw(broker.url, client, args.procs, args.tasks)
        ours = measure_fedqueue(broker.url, client, args.procs, args.tasks, Path(tmp))
        parts = breakdown(broker.url, Path(tmp), args.breakdown_tasks)
    report(args, raw, ours, parts)
    print(load.report())


def report(args: argparse.Namespace, raw: dict[str, float], ours: dict[str, Any], parts: dict[str, Any]) -> None:
    print(f"\n### Per-task overhead: {args.tasks} no-op tasks, {args.procs} worker processes x 1 slot\n")
    rows = [
        ("raw Celery no-op", f"{raw['round_rate']:.0f}", f"{raw['drain_rate']:.0f}"),
        (
            "fedqueue no-op device task (round incl. aggregation)",
            f"{ours['round_rate']:.0f}",
            f"{ours['drain_rate']:.0f}",
        ),
        (
            "fedqueue, tasks only (up to the last task's finish)",
            f"{ours['round_rate_tasks_only']:.0f}",
            f"{ours['drain_rate_tasks_only']:.0f}",
        ),
        (
            "fedqueue / raw Celery",
            f"{ours['round_rate'] / raw['round_rate']:.2f}",
            f"{ours['drain_rate'] / raw['drain_rate']:.2f}",
        ),
    ]
    print(markdown_table(["tasks/s", "round (enqueue while consuming)", "drain (already queued)"], rows))
    ratio_round = ours["round_rate"] / raw["round_rate"]
    ratio_drain = ours["drain_rate"] / raw["drain_rate"]
    print(
        f"\ntarget fedqueue >= {TARGET_RATIO:.0%} of raw Celery: round {ratio_round:.0%} "
        f"({verdict(ratio_round >= TARGET_RATIO)}), drain {ratio_drain:.0%} ({verdict(ratio_drain >= TARGET_RATIO)})"
    )
    print(
        f"fedqueue workers: {ours['task_busy_ms']:.2f} ms inside a task, {ours['between_tasks_ms']:.2f} ms between"
        f" two tasks of a slot (result write, round check, ack, next fetch); aggregation + evaluation of"
        f" {args.tasks} updates {ours['aggregation_s']:.2f} s; parallel efficiency"
        f" {100 * (ours['efficiency'] or 0):.1f} %; {ours['retried']} retried"
    )

    raw_task_us = 1e6 * args.procs / raw["drain_rate"]
    ours_task_us = 1e6 * args.procs / ours["drain_rate_tasks_only"]
    rows = sorted(parts["parts"].items(), key=lambda item: -item[1])
    body_us = 1e6 * parts["per_task_s"]
    table = [(label, f"{1e6 * seconds:.0f}", f"{100 * seconds / parts['per_task_s']:.0f} %") for label, seconds in rows]
    table.append(("**task body, in-process total**", f"**{body_us:.0f}**", "100 %"))
    print(
        f"\n### Where a fedqueue no-op task's time goes ({args.breakdown_tasks} tasks in one process, "
        f"same Redis, SQLite store)\n"
    )
    print(markdown_table(["part", "µs per task", "share of task body"], table))
    print(
        f"\nenqueue (scheduler side, Celery publish): {1e6 * parts['enqueue_per_task_s']:.0f} µs per task;"
        f" aggregation of {args.breakdown_tasks} updates: {parts['aggregation_s']:.2f} s"
    )
    print(
        f"worker time per task (slots / drain rate, tasks only): fedqueue {ours_task_us:.0f} µs, raw Celery"
        f" {raw_task_us:.0f} µs: Celery delivery, ack and events ≈ {raw_task_us:.0f} µs of fedqueue's; the task"
        f" body ≈ {body_us:.0f} µs; the rest ({ours_task_us - raw_task_us - body_us:.0f} µs) is contention between"
        f" worker processes (SQLite's single writer, the two cores)"
    )
    largest = rows[0]
    print(f"largest part of the task body: {largest[0]} ({1e6 * largest[1]:.0f} µs per task)")


if __name__ == "__main__":
    main()
