"""One FL round, four ways, in one run: is fedqueue really parallel, and how close to the floor?

    .venv/bin/python bench/fl_round.py [--devices 32] [--iters 20] [--batch 32] [--timed-rounds 3]
                                       [--ways loop,threads,fedqueue,floor] [--repeat 1]

The workload: the small CIFAR CNN on synthetic CIFAR-shaped data, K devices per round,
each trained for a number of local iterations, then FedAvg. Every way runs the same
rounds with the same seeds through the same functions (fedqueue.fl):

(a) loop: one process, one device after another, torch's default threads (as users run it);
(b) threads: a ThreadPoolExecutor with one thread per selected device, all on one model
    device (the design of today's thread-based FL simulators), torch's default threads;
(c) fedqueue: local_cluster with one worker process per core, the real submit path;
(d) floor: a pool of warm processes (spawn), one per core, torch threads = 1, no queue.

Each way runs 1 warm-up round, the timed rounds, and a last round (fedqueue evaluates
after its last round; nobody is timed on that). fedqueue's rounds are timed from the
store: from the first round's enqueue to the last timed round's aggregation.
`--repeat N` runs the ways N times, every other time in reverse order, and prints the
ratio to the floor of each run, their mean and median: this machine drifts by up to 20 %
between runs, so one run's ratio moves by several percent; use an even N.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import multiprocessing
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import ForeignLoad, machine, machine_line, markdown_table, verdict, wait_for_quiet, wait_run  # noqa: E402

from fedqueue.fl.config import RunConfig  # noqa: E402

TARGETS = {"loop": 2.0, "threads": 1.7, "floor": 1.05, "efficiency": 0.85}
WAYS = ("loop", "threads", "fedqueue", "floor")
State = dict[str, Any]
Update = tuple[int, int, State]


def workload(devices: int, iters: int, batch: int, rounds: int) -> RunConfig:
    return RunConfig.from_dict(
        {
            "name": f"bench-fl-round-k{devices}",
            "dataset": "synthetic",
            "model": "cnn",
            "num_devices": devices,
            "devices_per_round": devices,
            "rounds": rounds,
            "local_iters": iters,
            "local_batch_size": batch,
            "local_lr": 0.05,
            "seed": 0,
            "eval_every": rounds,
        }
    )


def train_device(config: RunConfig, state: State, round_index: int, device: int) -> Update:
    """One device's local training, exactly as a fedqueue worker does it."""
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
    outcome = train_local(model, device_data(spec, device), train_config(config), seed, torch.device("cpu"))
    return device, outcome.samples, outcome.state


def initial(config: RunConfig) -> State:
    from fedqueue.fl.ml.data import load_federated
    from fedqueue.fl.ml.models import initial_state
    from fedqueue.fl.setup import data_spec

    data = load_federated(data_spec(config))
    return initial_state(config.model, data.input_shape, data.num_classes, config.seed, config.plugin)


def selected(config: RunConfig, round_index: int) -> list[int]:
    from fedqueue.fl.strategy.sync.rounds import select_devices

    return select_devices(config.seed, round_index, config.num_devices, config.devices_per_round)


def fedavg(config: RunConfig, state: State, updates: list[Update]) -> State:
    from fedqueue.fl.ml.aggregate import fedavg as average

    return average(state, updates, config.global_lr)


def run_rounds(config: RunConfig, one_round: Any) -> tuple[list[float], State]:
    """Every round of the config through `one_round(state, round_index) -> updates`; seconds per round."""
    state = initial(config)
    seconds = []
    for round_index in range(1, config.rounds + 1):
        began = time.perf_counter()
        state = fedavg(config, state, one_round(state, round_index))
        seconds.append(time.perf_counter() - began)
    return seconds, state


def way_loop(config: RunConfig) -> tuple[list[float], State]:
    return run_rounds(config, lambda state, r: [train_device(config, state, r, d) for d in selected(config, r)])


def way_threads(config: RunConfig) -> tuple[list[float], State]:
    with concurrent.futures.ThreadPoolExecutor(max_workers=config.devices_per_round) as pool:
        return run_rounds(
            config, lambda state, r: list(pool.map(lambda d: train_device(config, state, r, d), selected(config, r)))
        )


# (d): the pool's processes keep the global model of the current round, read once from a file.
_POOL_MODEL: tuple[str, State] | None = None


def _pool_init() -> None:
    import torch

    from fedqueue.fl.ml.warmup import warm_up

    torch.set_num_threads(1)
    warm_up()


def _pool_task(args: tuple[dict[str, Any], str, int, int]) -> tuple[int, int, bytes]:
    global _POOL_MODEL
    from fedqueue.fl.ml.weights import decode_state, encode_state

    raw_config, model_path, round_index, device = args
    if _POOL_MODEL is None or _POOL_MODEL[0] != model_path:
        _POOL_MODEL = (model_path, decode_state(Path(model_path).read_bytes()))
    _, samples, state = train_device(RunConfig.from_dict(raw_config), _POOL_MODEL[1], round_index, device)
    return device, samples, encode_state(state)


def way_floor(config: RunConfig, procs: int, folder: Path) -> tuple[list[float], State]:
    from fedqueue.fl.ml.weights import decode_state, encode_state

    context = multiprocessing.get_context("spawn")  # never fork a process that has imported torch
    with context.Pool(procs, initializer=_pool_init) as pool:
        pool.map(_pool_task, [])  # the pool is up
        raw = config.to_dict()

        def one_round(state: State, round_index: int) -> list[Update]:
            path = folder / f"floor-global-{round_index}.safetensors"
            path.write_bytes(encode_state(state))
            jobs = [(raw, str(path), round_index, device) for device in selected(config, round_index)]
            done = pool.imap_unordered(_pool_task, jobs)
            return [(device, samples, decode_state(blob)) for device, samples, blob in done]

        return run_rounds(config, one_round)


def way_fedqueue(config: RunConfig, procs: int, folder: Path) -> tuple[list[float], State, dict[str, Any]]:
    import fedqueue
    from fedqueue.config import Settings
    from fedqueue.fl.store.results import list_rounds
    from fedqueue.report import build_report

    settings = Settings(database_url=f"sqlite:///{folder / 'fl_round.db'}", key_prefix="bench-fl-round")
    with fedqueue.local_cluster(procs=procs, settings=settings) as cluster:
        handle = fedqueue.submit(config, settings=cluster.settings)
        status = wait_run(handle, cluster)
        if status["state"] != "finished":
            raise RuntimeError(f"fedqueue run ended {status['state']}: {status['error']}")
        rounds = list_rounds(handle.store, handle.id)
        report = build_report(handle.store, handle.id)
        weights = handle.final_weights()
    seconds = [row.aggregated_at - row.enqueued_at for row in rounds if row.aggregated_at is not None]
    timed = rounds[1:-1]
    span = (timed[-1].aggregated_at - timed[0].enqueued_at) / len(timed)
    timed_reports = report["rounds"][1:-1]
    busy = sum((r["parallel_efficiency"] or 0) * r["wall_s"] for r in timed_reports)
    extra = {
        "span_per_round_s": span,
        "efficiency": busy / sum(r["wall_s"] for r in timed_reports),
        "slots": report["slots"],
        "between_tasks_ms": report["time"]["between_tasks_mean_ms"],
        "run_id": handle.id,
        "queue_wait_s": [r["time"]["queue_wait_mean_s"] for r in timed_reports],
    }
    return seconds, weights, extra


def max_difference(left: State, right: State) -> float:
    return max(float((left[name].double() - right[name].double()).abs().max()) for name in left)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, default=32, help="K: devices per round (at least 32 for the record)")
    parser.add_argument("--iters", type=int, default=20, help="local iterations per device")
    parser.add_argument("--batch", type=int, default=32, help="local batch size")
    parser.add_argument("--timed-rounds", type=int, default=3)
    parser.add_argument("--procs", type=int, default=os.cpu_count() or 1)
    parser.add_argument(
        "--ways", default=",".join(WAYS), help="which ways to run (fedqueue and floor: the floor check alone)"
    )
    parser.add_argument("--repeat", type=int, default=1, help="run the ways this many times, alternating their order")
    args = parser.parse_args()
    ways = [way.strip() for way in args.ways.split(",") if way.strip()]
    unknown = sorted(set(ways) - set(WAYS))
    if args.repeat < 1:
        parser.error(f"--repeat: {args.repeat}; at least 1")
    if unknown or not ways:
        parser.error(f"--ways: unknown {', '.join(unknown) or '(none given)'}; choose from {', '.join(WAYS)}")
    config = workload(args.devices, args.iters, args.batch, args.timed_rounds + 2)
    info = machine()
    print(machine_line(info))
    print(
        f"workload: cnn on synthetic CIFAR-shaped data, K={args.devices} devices x {args.iters} local iterations"
        f" (batch {args.batch}) per round, {args.timed_rounds} timed rounds after a warm-up round; {args.procs} processes"
    )
    wait_for_quiet()
    over_floor = []
    for repeat in range(args.repeat):
        # Every other repeat runs the ways in reverse, so a machine that drifts favours none of them.
        order = ways if repeat % 2 == 0 else ways[::-1]
        load = ForeignLoad()
        results: dict[str, list[float]] = {}
        weights: dict[str, State] = {}
        with tempfile.TemporaryDirectory(prefix="fedqueue-bench-") as tmp:
            folder = Path(tmp)
            extra: dict[str, Any] = {}
            for way in order:
                if way == "fedqueue":
                    results[way], weights[way], extra = way_fedqueue(config, args.procs, folder)
                elif way == "floor":
                    results[way], weights[way] = way_floor(config, args.procs, folder)
                elif way == "loop":
                    results[way], weights[way] = way_loop(config)
                else:
                    results[way], weights[way] = way_threads(config)
        if args.repeat > 1:
            print(f"\n## Run {repeat + 1} of {args.repeat} (ways in the order {', '.join(order)})")
        ratio = print_results(args, config, results, weights, extra, load.report())
        if ratio is not None:
            over_floor.append(ratio)
    if len(over_floor) > 1:
        # Runs drift by several percent here: the mean over both orders is the figure to read.
        each = ", ".join(f"{ratio:.3f}x" for ratio in over_floor)
        mean = statistics.fmean(over_floor)
        print(
            f"\n(c) vs (d) floor over {len(over_floor)} runs: {each}; mean {mean:.3f}x,"
            f" median {statistics.median(over_floor):.3f}x (target <= {TARGETS['floor']}x: {verdict(mean <= TARGETS['floor'])})"
        )


def print_results(
    args: argparse.Namespace,
    config: RunConfig,
    results: dict[str, list[float]],
    weights: dict[str, State],
    extra: dict[str, Any],
    foreign: str,
) -> float | None:
    """Print one run's tables; returns fedqueue's ratio to the floor when both ran."""
    timed = slice(1, config.rounds - 1)
    per_round = {name: sum(values[timed]) / len(values[timed]) for name, values in results.items()}
    if "fedqueue" in per_round:
        per_round["fedqueue"] = extra["span_per_round_s"]
    labels = {
        "loop": "(a) sequential loop, 1 process, torch default threads",
        "threads": f"(b) ThreadPoolExecutor, {config.devices_per_round} threads, one model device",
        "fedqueue": f"(c) fedqueue, {args.procs} worker processes x 1 slot",
        "floor": f"(d) floor: warm spawn pool, {args.procs} processes, 1 torch thread",
    }
    base = "loop" if "loop" in per_round else "floor" if "floor" in per_round else "fedqueue"
    rows = []
    for name in (name for name in WAYS if name in per_round):
        each = ", ".join(f"{value:.2f}" for value in results[name][timed])
        rows.append((labels[name], f"{per_round[name]:.2f}", each, f"{per_round[base] / per_round[name]:.2f}x"))
    print(f"\n### One FL round: K={config.devices_per_round}, {args.iters} local iterations of batch {args.batch}\n")
    print(markdown_table(["way", "s per round", "timed rounds (s)", f"speed-up over {labels[base][:3]}"], rows))
    if "fedqueue" not in per_round:
        print(foreign)
        return None
    fq = per_round["fedqueue"]
    checks = []
    if "loop" in per_round:
        over_loop = per_round["loop"] / fq
        checks.append(("(c) vs (a) loop", over_loop, f">= {TARGETS['loop']}x faster", over_loop >= TARGETS["loop"]))
    if "threads" in per_round:
        over_threads = per_round["threads"] / fq
        checks.append(
            ("(c) vs (b) threads", over_threads, f">= {TARGETS['threads']}x faster", over_threads >= TARGETS["threads"])
        )
    if "floor" in per_round:
        over_floor = fq / per_round["floor"]
        checks.append(
            ("(c) vs (d) floor", over_floor, f"<= {TARGETS['floor']}x the floor", over_floor <= TARGETS["floor"])
        )
    checks.append(
        (
            "(c) parallel efficiency",
            extra["efficiency"],
            f">= {TARGETS['efficiency']:.0%}",
            extra["efficiency"] >= TARGETS["efficiency"],
        )
    )
    print()
    print(
        markdown_table(
            ["ratio", "measured", "target", ""],
            [
                (name, f"{value:.1%}" if "efficiency" in name else f"{value:.2f}x", target, verdict(ok))
                for name, value, target, ok in checks
            ],
        )
    )
    store_rounds = ", ".join(f"{value:.2f}" for value in results["fedqueue"][timed])
    print(
        f"\nfedqueue: per round from the store (enqueue to aggregation) {store_rounds} s; span incl. the step to the"
        f" next round {fq:.2f} s; {extra['slots']} slots; between two tasks of a slot"
        f" {extra['between_tasks_ms']:.1f} ms; mean queue wait per round {extra['queue_wait_s']} s"
    )
    if "floor" in weights:
        differences = [
            f"(c) vs (d) max |diff| {max_difference(weights['fedqueue'], weights['floor']):.3g} (both 1 torch thread)"
        ]
        differences += [
            f"{labels[name][:3]} vs (d) {max_difference(weights[name], weights['floor']):.3g}"
            for name in ("loop", "threads")
            if name in weights
        ]
        print("same training: final weights " + "; ".join(differences) + " (torch default threads)")
    print(foreign)
    return fq / per_round["floor"] if "floor" in per_round else None


if __name__ == "__main__":
    main()
