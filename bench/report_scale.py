"""The report, status and TensorBoard files of a long buffered run: 100,000 devices, 10,000 versions.

Training 10,000 versions takes hours; the report reads only rows. So the run is written into a SQLite store
with the store's own statements, shaped as a FedBuff run of the digits MLP makes them: `in_flight` devices
sent off with version 0, `buffer_size` more with each version published, each device's task timed on one of
the workers' slots in the order sent, a fold pass per version, utilization samples once a second. Then the
commands a researcher runs on it are timed as processes: `fedqueue report`, `fedqueue status`, `fedqueue report
--tensorboard`; with the size of what they write and their peak memory.

    .venv/bin/python bench/report_scale.py                       # 10,000 versions of 10 updates, 100,000 devices
    .venv/bin/python bench/report_scale.py --versions 1000,10000  # several cases, one table
"""

from __future__ import annotations

import argparse
import heapq
import os
import random
import subprocess
import sys
import tempfile
import time
from collections import deque
from dataclasses import asdict
from pathlib import Path
from typing import Any

from sqlalchemy import insert, update

from fedqueue.core.database import open_store
from fedqueue.fl.store.schema import DeviceTaskRow, RoundRow
from fedqueue.store import Store
from fedqueue.store.repo import TaskTiming
from fedqueue.store.schema import RunRow
from fedqueue.store.utilization import Sample, record_samples

TASK_S = (0.010, 0.020)  # a device's training of 20 samples, one epoch: its task's seconds, drawn
FOLD_S = 0.004  # a fold pass of buffer_size updates into the MLP
EVAL_S = 0.030  # an evaluation on the held-out set
EVAL_EVERY = 10


def buffered_run(
    store: Store,
    run_id: str,
    *,
    versions: int,
    devices: int = 100_000,
    buffer_size: int = 10,
    in_flight: int = 1000,
    workers: int = 8,
    slots: int = 2,
    seed: int = 0,
) -> None:
    """Write a finished FedBuff run of `versions` versions into `store`, as its workers and follower would."""
    rng = random.Random(seed)
    config = {
        "mode": "fedbuff",
        "dataset": "digits",
        "model": "mlp",
        "num_devices": devices,
        "concurrency": in_flight,
        "buffer_size": buffer_size,
        "max_model_version": versions,
        "partition": "dirichlet_fixed",
        "client_data_size": 20,
        "local_epochs": 1,
        "eval_every": EVAL_EVERY,
    }
    store.create_run(run_id, "long fedbuff", config, versions, kind="fl")
    names = [(f"cpu{worker}@bench", 4000 + worker) for worker in range(workers)]
    free = [(0.0, lane) for lane in range(workers * slots)]  # (free from, lane): slot `lane % slots` of a worker
    queue: deque[tuple[int, int, float]] = deque((1, device, 0.2) for device in rng.sample(range(devices), in_flight))
    selected: dict[int, list[int]] = {1: [device for _, device, _ in queue]}
    enqueued: dict[int, float] = {1: 0.2}
    timings: list[dict[str, Any]] = []
    results: list[dict[str, Any]] = []
    rounds: list[dict[str, Any]] = []
    buffer: list[tuple[int, int, float]] = []  # (round, device, arrived) of the version being made
    made = 0.0
    for version in range(1, versions + 1):
        while len(buffer) < buffer_size:
            round_index, device, sent = queue.popleft()
            begun, lane = heapq.heappop(free)
            worker, pid = names[lane // slots]
            start = max(begun, sent) + rng.uniform(0.0005, 0.002)  # the result's write, the ack, the next fetch
            finish = start + rng.uniform(*TASK_S)
            heapq.heappush(free, (finish, lane))
            timings.append(_timing(run_id, "train", f"round {round_index} device {device}", round_index, worker, pid))
            timings[-1].update(
                enqueued_at=sent, started_at=start, finished_at=finish, compute_ms=(finish - start) * 800
            )
            timings[-1].update(load_ms=(finish - start) * 150, upload_ms=(finish - start) * 50)
            results.append(
                {
                    "run_id": run_id,
                    "round_index": round_index,
                    "device": device,
                    "state": "done",
                    "worker": worker,
                    "attempt": 1,
                    "samples": 20,
                    "loss": 2.3 * 0.9998**version,
                    "fate": "folded",
                    "staleness": version - round_index,
                    "weight": 1.0,
                    "folded_into": version,
                    "sim_dispatched": sent,
                    "sim_arrived": finish,
                }
            )
            buffer.append((round_index, device, finish))
        # The fold pass runs in the worker that stored the buffer's last update, beside its slots.
        worker, pid = names[int(rng.random() * workers)]
        folded_at = max(made, max(arrived for _, _, arrived in buffer))
        evaluated = version % EVAL_EVERY == 0 or version == versions
        made = folded_at + FOLD_S + (EVAL_S if evaluated else 0.0)
        fold = _timing(run_id, "aggregate", f"version {version} fold", version, worker, pid)
        fold.update(enqueued_at=folded_at, started_at=folded_at, finished_at=made, compute_ms=1000 * (made - folded_at))
        timings.append(fold)
        accuracy = 0.95 - 0.85 * 0.9995**version + rng.uniform(-0.01, 0.01)
        rounds.append(
            _round(run_id, version, selected[version], enqueued[version], made, buffer_size, evaluated, accuracy)
        )
        buffer = []
        # Version `version` published: buffer_size more devices sent off with it, as round version + 1.
        sent_now = rng.sample(range(devices), buffer_size)
        selected[version + 1], enqueued[version + 1] = sent_now, made
        queue.extend((version + 1, device, made) for device in sent_now)
    _write(store, run_id, made, names, timings, results, rounds)


def _timing(run_id: str, task_type: str, task: str, round_index: int, worker: str, pid: int) -> dict[str, Any]:
    return asdict(
        TaskTiming(
            run_id=run_id,
            kind="fl",
            task_type=task_type,
            task=task,
            round_index=round_index,
            state="done",
            worker=worker,
            device_used="cpu",
            attempt=1,
            enqueued_at=0.0,
            started_at=0.0,
            finished_at=0.0,
            pid=pid,
        )
    )


def _round(
    run_id: str,
    version: int,
    selected: list[int],
    enqueued_at: float,
    made: float,
    buffer_size: int,
    evaluated: bool,
    accuracy: float,
) -> dict[str, Any]:
    return {
        "run_id": run_id,
        "round_index": version,
        "version": version - 1,
        "state": "done",
        "selected": selected,
        "model_key": f"{run_id}/v{version}",
        "model_sha256": "0" * 64,
        "model_nbytes": 40_000,
        "enqueued_at": enqueued_at,
        "stored": len(selected),
        "aggregated_at": made,
        "aggregate_ms": 1000 * FOLD_S,
        "eval_ms": 1000 * EVAL_S if evaluated else None,
        "accuracy": accuracy if evaluated else None,
        "loss": 2.0 * (1 - accuracy) if evaluated else None,
        "train_loss": 2.3 * 0.9998**version,
        "sim_time": made * 3,
        "label_wise": {"accuracy": [accuracy] * 10, "loss": [2.0 * (1 - accuracy)] * 10} if evaluated else None,
    }


def _write(
    store: Store,
    run_id: str,
    length: float,
    names: list[tuple[str, int]],
    timings: list[dict[str, Any]],
    results: list[dict[str, Any]],
    rounds: list[dict[str, Any]],
) -> None:
    """Shift the made-up times to end a few seconds ago and insert every row, each table in one executemany."""
    origin = time.time() - length - 0.5
    for row in timings:
        for key in ("enqueued_at", "started_at", "finished_at"):
            row[key] += origin
    for row in rounds:
        row["enqueued_at"] += origin
        row["aggregated_at"] += origin
    with store.engine.begin() as connection:
        connection.execute(update(RunRow).where(RunRow.id == run_id).values(created_at=origin))
        connection.execute(insert(RoundRow), rounds)
        connection.execute(insert(DeviceTaskRow), results)
        connection.execute(store.timing_upsert, timings)
    samples = [
        Sample(worker, pid, "cpu", origin + second, 80.0 + (second % 7), 600 * 2**20)
        for worker, pid in names
        for second in range(1, int(length) + 1)
    ]
    record_samples(store, samples)
    store.finish_run(run_id, "finished")


# The commands, timed


def timed_command(args: list[str], database: Path, cwd: Path) -> dict[str, Any]:
    """Run `fedqueue ARGS` on the store: seconds, its output and its peak resident memory (MiB, by GNU time)."""
    env = {**os.environ, "FEDQUEUE_DATABASE_URL": f"sqlite:///{database}", "COLUMNS": "120"}
    peak = cwd / "peak-kib.txt"
    command = ["/usr/bin/time", "-f", "%M", "-o", str(peak), sys.executable, "-m", "fedqueue.cli", *args]
    began = time.perf_counter()
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - began
    if done.returncode != 0:
        raise SystemExit(f"fedqueue {' '.join(args)} failed: {done.stderr.strip()}")
    return {"s": seconds, "out": done.stdout, "mib": int(peak.read_text().split()[-1]) / 1024}


def _size(path: Path) -> int:
    return sum(file.stat().st_size for file in path.rglob("*") if file.is_file())


def measure(versions: int, devices: int, buffer_size: int, folder: Path) -> dict[str, Any]:
    database = folder / "store.db"
    store = open_store(f"sqlite:///{database}", migrate=True)
    began = time.perf_counter()
    try:
        buffered_run(store, "long", versions=versions, devices=devices, buffer_size=buffer_size)
    finally:
        store.close()
    written_s = time.perf_counter() - began
    report = timed_command(["report", "long", "-o", str(folder / "report")], database, folder)
    status = timed_command(["status", "long"], database, folder)
    boards = timed_command(["report", "long", "--tensorboard", str(folder / "tb")], database, folder)
    html = folder / "report" / "report.html"
    return {
        "versions": versions,
        "devices": devices,
        "updates": versions * buffer_size,
        "store_s": written_s,
        "report_s": report["s"],
        "report_mib": report["mib"],
        "html_kib": html.stat().st_size / 1024,
        "folder_kib": _size(folder / "report") / 1024,
        "status_s": status["s"],
        "status_lines": len(status["out"].splitlines()),
        "status_longest": max((len(line) for line in status["out"].splitlines()), default=0),
        "tensorboard_s": boards["s"],
        "tensorboard_kib": _size(folder / "tb") / 1024,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--versions", default="10000", help="comma-separated version counts, one case each")
    parser.add_argument("--devices", type=int, default=100_000)
    parser.add_argument("--buffer-size", type=int, default=10)
    parser.add_argument("--keep", type=Path, help="write each case's store and files under this folder, kept")
    options = parser.parse_args()
    from common import machine, machine_line, markdown_table

    print(machine_line(machine()))
    print(f"load average {os.getloadavg()}")
    rows = []
    for versions in [int(value) for value in options.versions.split(",")]:
        with tempfile.TemporaryDirectory() as scratch:
            folder = (options.keep or Path(scratch)) / f"v{versions}"
            folder.mkdir(parents=True, exist_ok=True)
            found = measure(versions, options.devices, options.buffer_size, folder)
        print(found, flush=True)
        rows.append(
            [
                f"{found['versions']:,}",
                f"{found['updates']:,}",
                f"{found['report_s']:.1f}",
                f"{found['report_mib']:.0f}",
                f"{found['html_kib']:,.0f}",
                f"{found['folder_kib']:,.0f}",
                f"{found['status_s']:.1f}",
                found["status_lines"],
                f"{found['tensorboard_s']:.1f}",
                f"{found['tensorboard_kib']:,.0f}",
            ]
        )
    headers = ["versions", "updates", "report s", "report MiB", "HTML KiB", "report folder KiB"]
    headers += ["status s", "status lines", "TensorBoard s", "event files KiB"]
    print(markdown_table(headers, rows))
    print(f"load average {os.getloadavg()}")


if __name__ == "__main__":
    main()
