"""Packed training: devices per second with packs of 1 and 16 (back to back, or vmapped), against a plain loop.

    .venv/bin/python bench/packing.py            # the two CPU cases, on this machine
    .venv/bin/python bench/packing.py --gpu      # the GPU case: needs a CUDA GPU

CPU cases, each run four ways in one run:
(1) the digits demo config at 1,000 devices per round (num_devices = devices_per_round = 1000,
    so each device holds 1 or 2 of the 1,437 training digits: 10 local epochs of tiny batches);
(2) the small CIFAR CNN on synthetic CIFAR-shaped data, 64 devices per round, 20 steps of batch 32.

Ways: (a) a plain sequential loop in one process (torch's default threads), (b) fedqueue with
pack 1, (c) pack 16 sequential, (d) pack 16 vmapped; fedqueue runs one worker per core.
Every way runs a warm-up round, the timed rounds and a last (evaluated) round; fedqueue's
rounds are timed from the store, from the first timed round's enqueue to the last one's end.

GPU case (`--gpu`): 100 devices of the CIFAR CNN per round, 25 steps of batch 32, one GPU:
a thread pool of 100 threads sharing cuda:0 (the simulators' design), fedqueue pack 1 with
1 process and with 4 processes per GPU, and vmapped packs of 25 and 100.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (  # noqa: E402
    ForeignLoad,
    machine,
    machine_line,
    markdown_table,
    ratio,
    verdict,
    wait_for_quiet,
    wait_run,
)
from fl_round import fedavg, initial, selected  # noqa: E402

from fedqueue.fl.config import RunConfig  # noqa: E402
from fedqueue.fl.store.results import list_rounds  # noqa: E402

State = dict[str, Any]
PACK = 16
CPU_TARGETS = {"vmap_digits": 5.0, "sequential_digits": 1.2, "sequential_cnn": 1.0}
GPU_TARGETS = {"round_s": 0.5, "over_threads": 20.0}


def digits_case(timed: int) -> RunConfig:
    """The demo config (examples/digits_fedavg.toml) at 1,000 devices per round."""
    return RunConfig.from_dict(
        {
            "name": "bench-packing-digits",
            "dataset": "digits",
            "model": "mlp",
            "num_devices": 1000,
            "devices_per_round": 1000,
            "rounds": timed + 2,
            "local_epochs": 10,
            "local_batch_size": 4,
            "local_lr": 0.2,
            "seed": 0,
            "eval_every": timed + 2,
        }
    )


def cnn_case(timed: int, devices: int = 64, steps: int = 20) -> RunConfig:
    return RunConfig.from_dict(
        {
            "name": f"bench-packing-cnn-{devices}",
            "dataset": "synthetic",
            "model": "cnn",
            "num_devices": devices,
            "devices_per_round": devices,
            "samples_per_device": 64,
            "rounds": timed + 2,
            "local_iters": steps,
            "local_batch_size": 32,
            "local_lr": 0.05,
            "seed": 0,
            "eval_every": timed + 2,
        }
    )


@dataclass
class Way:
    label: str
    seconds: float  # per timed round
    devices: int  # per round
    weights: State | None = None
    run: Any = None  # fedqueue's RunHandle, for ways through fedqueue

    @property
    def per_s(self) -> float:
        return self.devices / self.seconds


def plain_loop(config: RunConfig, device: str = "cpu") -> Way:
    """(a): every device one after another in this process, the way a for-loop simulator runs them."""
    import torch

    state = initial(config)
    seconds = []
    for round_index in range(1, config.rounds + 1):
        began = time.perf_counter()
        updates = [_train(config, state, round_index, d, device) for d in selected(config, round_index)]
        state = fedavg(config, state, updates)
        seconds.append(time.perf_counter() - began)
    if device != "cpu":
        torch.cuda.synchronize()
    timed = seconds[1:-1]
    return Way("plain loop, 1 process", sum(timed) / len(timed), config.devices_per_round, state)


def thread_pool(config: RunConfig, device: str) -> Way:
    """The simulators' design: one thread per device of the round, all on one model device."""
    state = initial(config)
    seconds = []
    with concurrent.futures.ThreadPoolExecutor(max_workers=config.devices_per_round) as pool:
        for round_index in range(1, config.rounds + 1):
            began = time.perf_counter()
            jobs = [(config, state, round_index, d, device) for d in selected(config, round_index)]
            state = fedavg(config, state, list(pool.map(lambda job: _train(*job), jobs)))
            seconds.append(time.perf_counter() - began)
    timed = seconds[1:-1]
    label = f"thread pool, {config.devices_per_round} threads on {device}"
    return Way(label, sum(timed) / len(timed), config.devices_per_round, state)


def _train(config: RunConfig, state: State, round_index: int, device: int, where: str) -> tuple[int, int, State]:
    import torch

    from fedqueue.fl.ml.data import device_data, load_federated
    from fedqueue.fl.ml.models import build_model
    from fedqueue.fl.ml.seeding import task_seed
    from fedqueue.fl.ml.train import train_local
    from fedqueue.fl.setup import data_spec, train_config

    spec = data_spec(config)
    federated = load_federated(spec)
    model = build_model(config.model, federated.input_shape, federated.num_classes, config.plugin)
    model.load_state_dict(state)
    seed = task_seed(config.seed, round_index, device)
    outcome = train_local(model, device_data(spec, device), train_config(config), seed, torch.device(where))
    return device, outcome.samples, outcome.state


def through_fedqueue(cluster: Any, config: RunConfig, label: str) -> Way:
    import fedqueue

    handle = fedqueue.submit(config, settings=cluster.settings)
    status = wait_run(handle, cluster)
    if status["state"] != "finished":
        raise RuntimeError(f"{label}: run ended {status['state']}: {status['error']}")
    rounds = list_rounds(handle.store, handle.id)[1:-1]
    assert all(row.aggregated_at is not None for row in rounds)
    span = (rounds[-1].aggregated_at - rounds[0].enqueued_at) / len(rounds)  # type: ignore[operator]
    return Way(label, span, config.devices_per_round, handle.final_weights(), run=handle)


def gpu_busy(way: Way) -> str:
    """The run's mean GPU utilization from its report; ask once its cluster stopped, since workers
    write their samples every few seconds and on stopping, and a fast run ends before the first write."""
    from fedqueue.report import build_report

    if way.run is None:
        return ""
    report = build_report(way.run.store, way.run.id)
    used = [
        row["utilization_mean"] for row in report["utilization"] if row["kind"] == "gpu" and row["utilization_mean"]
    ]
    return f"GPU {sum(used) / len(used):.0f} % busy" if used else "no sample"


def max_difference(left: State | None, right: State | None) -> float:
    assert left is not None and right is not None
    return max(float((left[name].double() - right[name].double()).abs().max()) for name in left)


def cpu_cases(timed: int, procs: int, folder: Path, only: str) -> list[tuple[str, RunConfig, list[Way]]]:
    import fedqueue
    from fedqueue.config import Settings

    cases = [("(1) digits MLP, 1,000 devices", digits_case(timed)), ("(2) CIFAR CNN, 64 devices", cnn_case(timed))]
    cases = [case for case in cases if only in ("all", case[1].model)]
    results = []
    settings = Settings(database_url=f"sqlite:///{folder / 'packing.db'}", key_prefix="bench-packing")
    with fedqueue.local_cluster(procs=procs, settings=settings) as cluster:
        for title, config in cases:
            print(f"{title}: fedqueue ...", flush=True)
            ways = [
                through_fedqueue(
                    cluster,
                    config.with_keys(pack_size=1, pack_mode="sequential"),
                    f"fedqueue pack 1, {procs} processes",
                ),
                through_fedqueue(cluster, config.with_keys(pack_size=PACK), f"fedqueue pack {PACK} sequential"),
                through_fedqueue(
                    cluster, config.with_keys(pack_size=PACK, pack_mode="vmap"), f"fedqueue pack {PACK} vmap"
                ),
            ]
            results.append((title, config, ways))
    for title, config, ways in results:
        print(f"{title}: plain loop ...", flush=True)
        ways.insert(0, plain_loop(config))
    return results


def print_cpu(results: list[tuple[str, RunConfig, list[Way]]]) -> None:
    for title, config, ways in results:
        loop, pack1, sequential, vmapped = ways
        print(f"\n### {title} per round ({config.rounds - 2} timed rounds)\n")
        rows = [
            (
                way.label,
                f"{way.seconds:.2f}",
                f"{way.per_s:.0f}",
                ratio(pack1.seconds, way.seconds),
                ratio(loop.seconds, way.seconds),
            )
            for way in ways
        ]
        print(markdown_table(["way", "s per round", "devices per s", "vs pack 1", "vs loop"], rows))
        print(
            f"\nweights: pack {PACK} sequential vs pack 1 max difference {max_difference(sequential.weights, pack1.weights):.1e}"
            f" (0 = bit for bit); vmap vs pack 1 {max_difference(vmapped.weights, pack1.weights):.1e}"
        )
    by_model = {config.model: ways for _, config, ways in results}
    checks, reported = [], []
    if "mlp" in by_model:
        digits = by_model["mlp"]
        checks.append(
            ("(1) vmapped packs vs pack 1", digits[1].seconds / digits[3].seconds, CPU_TARGETS["vmap_digits"])
        )
        checks.append(
            ("(1) sequential packs vs pack 1", digits[1].seconds / digits[2].seconds, CPU_TARGETS["sequential_digits"])
        )
    if "cnn" in by_model:
        cnn = by_model["cnn"]
        checks.append(
            ("(2) sequential packs vs pack 1", cnn[1].seconds / cnn[2].seconds, CPU_TARGETS["sequential_cnn"])
        )
        reported.append(
            ("(2) vmapped packs vs pack 1 (no target: reported)", f"{cnn[1].seconds / cnn[3].seconds:.2f}x", "-", "-")
        )
    rows = [(name, f"{value:.2f}x", f">= {target}x", verdict(value >= target)) for name, value, target in checks]
    print("\n" + markdown_table(["ratio", "measured", "target", ""], rows + reported))


def gpu_case(timed: int, folder: Path) -> None:
    import torch

    import fedqueue
    from fedqueue.config import Settings

    if not torch.cuda.is_available():
        raise SystemExit("--gpu: no CUDA GPU is visible to this process")
    config = cnn_case(timed, devices=100, steps=25)
    settings = Settings(database_url=f"sqlite:///{folder / 'packing-gpu.db'}", key_prefix="bench-packing-gpu")
    ways = [thread_pool(config, "cuda:0")]
    torch.cuda.empty_cache()
    with fedqueue.local_cluster(settings=settings) as cluster:
        one_each = config.with_keys(pack_size=1, pack_mode="sequential")
        ways.append(through_fedqueue(cluster, one_each, "fedqueue pack 1, 1 process per GPU"))
        for size in (25, 100):
            packed = config.with_keys(pack_size=size, pack_mode="vmap")
            ways.append(through_fedqueue(cluster, packed, f"fedqueue vmapped packs of {size}"))
    with fedqueue.local_cluster(settings=settings, procs_per_gpu=4) as cluster:
        ways.insert(2, through_fedqueue(cluster, one_each, "fedqueue pack 1, 4 processes per GPU"))
    threads = ways[0]
    print(f"\n### GPU: CIFAR CNN, 100 devices x 25 steps of batch 32 per round ({timed} timed rounds)\n")
    rows = [
        (way.label, f"{way.seconds:.3f}", f"{way.per_s:.0f}", ratio(threads.seconds, way.seconds), gpu_busy(way))
        for way in ways
    ]
    print(markdown_table(["way", "s per round", "devices per s", "vs thread pool", "GPU"], rows))
    best = min(ways[1:], key=lambda way: way.seconds)
    print(
        "\n"
        + markdown_table(
            ["target", "measured", ""],
            [
                (
                    f"round <= {GPU_TARGETS['round_s']} s",
                    f"{best.seconds:.3f} s ({best.label})",
                    verdict(best.seconds <= GPU_TARGETS["round_s"]),
                ),
                (
                    f">= {GPU_TARGETS['over_threads']:.0f}x the thread pool",
                    f"{threads.seconds / best.seconds:.1f}x",
                    verdict(threads.seconds / best.seconds >= GPU_TARGETS["over_threads"]),
                ),
            ],
        )
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--timed-rounds", type=int, default=2)
    parser.add_argument("--procs", type=int, default=os.cpu_count() or 1, help="CPU worker processes")
    parser.add_argument("--gpu", action="store_true", help="run the GPU case instead of the CPU cases")
    parser.add_argument("--case", choices=["all", "mlp", "cnn"], default="all", help="CPU cases to run (by model)")
    args = parser.parse_args()
    print(machine_line(machine()))
    wait_for_quiet()
    load = ForeignLoad()
    with tempfile.TemporaryDirectory(prefix="fedqueue-bench-") as tmp:
        if args.gpu:
            gpu_case(args.timed_rounds, Path(tmp))
        else:
            print_cpu(cpu_cases(args.timed_rounds, args.procs, Path(tmp), args.case))
    print("\n" + load.report())


if __name__ == "__main__":
    main()
