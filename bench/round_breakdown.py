"""Where a round's time goes: training alone in this process, then the same round through fedqueue, phase by phase.

    .venv/bin/python bench/round_breakdown.py [--devices 100] [--steps 25] [--pack 100] [--mode vmap]

The workload is bench/packing.py's CNN case (synthetic CIFAR-shaped data, batch 32). It runs on
cuda:0 when a GPU is visible, else on the CPU. Printed:
- in this process: ms per device trained alone (train_local) and per pack (train_pack), with
  the GPU synchronised, and what encoding the pack's updates costs: the floor of a task;
- through fedqueue (local_cluster, one worker per GPU or core): per timed round, the seconds
  from enqueue to aggregation, split into the wait for a first task, the tasks' load, compute
  and upload phases (summed over tasks), the tail from the last stored device to aggregation,
  and the aggregation task's own phases.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import machine, machine_line, markdown_table, wait_run  # noqa: E402
from packing import cnn_case  # noqa: E402

from fedqueue.fl.config import RunConfig  # noqa: E402


def _synchronise(where: Any) -> None:
    import torch

    if where.type == "cuda":
        torch.cuda.synchronize(where)


def in_process(config: RunConfig, repeats: int) -> list[tuple[str, str]]:
    import torch

    from fedqueue.fl.ml.data import device_data, load_federated
    from fedqueue.fl.ml.models import build_model
    from fedqueue.fl.ml.pack_train import train_pack
    from fedqueue.fl.ml.train import train_local
    from fedqueue.fl.ml.weights import encode_state
    from fedqueue.fl.setup import data_spec, train_config

    where = torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
    spec = data_spec(config)
    federated = load_federated(spec)
    model = build_model(config.model, federated.input_shape, federated.num_classes, config.plugin)
    initial = {key: value.clone() for key, value in model.state_dict().items()}
    devices = list(range(config.devices_per_round))
    pack = devices[: int(config.packing.pack_size)] if isinstance(config.packing.pack_size, int) else devices
    datas = [device_data(spec, device) for device in pack]
    cfg = train_config(config)

    def alone(device: int) -> None:
        model.load_state_dict(initial)
        train_local(model, datas[device], cfg, device, where)

    def together() -> list[Any]:
        model.load_state_dict(initial)
        return train_pack(model, datas, cfg, list(range(len(pack))), where).outcomes()

    alone(0)
    _synchronise(where)
    began = time.perf_counter()
    for index in range(repeats * 4):
        alone(index % len(pack))
    _synchronise(where)
    alone_ms = (time.perf_counter() - began) * 1000 / (repeats * 4)
    outcomes = together()
    _synchronise(where)
    began = time.perf_counter()
    for _ in range(repeats):
        outcomes = together()
    _synchronise(where)
    pack_ms = (time.perf_counter() - began) * 1000 / repeats
    began = time.perf_counter()
    for outcome in outcomes:
        encode_state(outcome.state)
    encode_ms = (time.perf_counter() - began) * 1000
    rows = [
        (f"one device alone, {cfg.local_iters} steps (train_local)", f"{alone_ms:.1f} ms"),
        (f"a vmapped pack of {len(pack)} (train_pack)", f"{pack_ms:.1f} ms ({pack_ms / len(pack):.2f} ms a device)"),
        (f"encoding the pack's {len(pack)} updates", f"{encode_ms:.1f} ms"),
    ]
    if where.type == "cuda":
        rows.append(("profile of one pack: top operators by CPU time", "below"))
        with torch.profiler.profile(
            activities=[torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
        ) as profile:
            together()
            _synchronise(where)
        print(profile.key_averages().table(sort_by="self_cpu_time_total", row_limit=25), flush=True)
    return rows


def through_fedqueue(config: RunConfig, folder: Path) -> None:
    import fedqueue
    from fedqueue.config import Settings
    from fedqueue.fl.store.results import list_rounds

    settings = Settings(database_url=f"sqlite:///{folder / 'breakdown.db'}", key_prefix="bench-breakdown")
    with fedqueue.local_cluster(settings=settings) as cluster:
        handle = fedqueue.submit(config, settings=cluster.settings)
        status = wait_run(handle, cluster)
        if status["state"] != "finished":
            raise RuntimeError(f"run ended {status['state']}: {status['error']}")
        store = handle.store
        rows = []
        for round_row in list_rounds(store, handle.id)[1:-1]:
            timings = store.task_timings(handle.id, round_row.round_index)
            trained = [row for row in timings if row.task_type == "train"]
            # A vmapped pack's devices share one timing: count each pack's phases once.
            tasks = {(row.pack or row.task, row.started_at): row for row in trained}.values()
            aggregations = [row for row in timings if row.task_type == "aggregate"]
            enqueued = round_row.enqueued_at
            last_stored = max(row.finished_at for row in trained)
            aggregation = aggregations[-1] if aggregations else None
            rows.append(
                (
                    str(round_row.round_index),
                    f"{round_row.aggregated_at - enqueued:.3f}",
                    f"{min(row.started_at for row in trained) - enqueued:.3f}",
                    str(len(tasks)),
                    f"{sum(row.load_ms for row in tasks) / 1000:.3f}",
                    f"{sum(row.compute_ms for row in tasks) / 1000:.3f}",
                    f"{sum(row.upload_ms for row in tasks) / 1000:.3f}",
                    f"{round_row.aggregated_at - last_stored:.3f}",
                    "-"
                    if aggregation is None
                    else f"{aggregation.load_ms:.0f}/{aggregation.compute_ms:.0f}/{aggregation.upload_ms:.0f}",
                )
            )
        headers = ["round", "s", "to 1st task", "tasks", "load s", "compute s", "upload s", "tail s", "aggregate ms"]
        print(markdown_table(headers, rows), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, default=100)
    parser.add_argument("--steps", type=int, default=25)
    parser.add_argument("--pack", type=int, default=100)
    parser.add_argument("--mode", choices=["sequential", "vmap"], default="vmap")
    parser.add_argument("--timed-rounds", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=3, help="in-process repetitions of each measurement")
    parser.add_argument("--skip-in-process", action="store_true")
    args = parser.parse_args()
    print(machine_line(machine()))
    config = cnn_case(args.timed_rounds, devices=args.devices, steps=args.steps).with_keys(
        pack_size=args.pack, pack_mode=args.mode
    )
    title = f"{args.devices} devices x {args.steps} steps, pack {args.pack} {args.mode}"
    if not args.skip_in_process:
        print(f"\n### In this process: {title}\n")
        print(markdown_table(["what", "time"], in_process(config, args.repeats)), flush=True)
    print(f"\n### Through fedqueue: {title}, timed rounds\n", flush=True)
    with tempfile.TemporaryDirectory(prefix="fedqueue-bench-") as tmp:
        through_fedqueue(config, Path(tmp))


if __name__ == "__main__":
    main()
