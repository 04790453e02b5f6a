"""The data plane at ResNet-18's state size: the same FL work through fedqueue and through a one-thread loop.

    .venv/bin/python bench/data_plane.py [--cases carrier,resnet,digits] [--modes fedavg,fedbuff]
        [--timed-rounds 2] [--carrier-devices 10] [--resnet-devices 4] [--resnet-steps 2]
        [--digits-devices 20] [--procs N] [--pack-size auto] [--pack-mode auto] [--quick] [--busy-ok]
        [--no-pair]
    .venv/bin/python bench/data_plane.py --phases-only    # each phase of one update alone, in seconds

Cases, each as sync FedAvg and as FedBuff, through fedqueue (one local cluster, one worker process per
core, the defaults: packs chosen at submit) and through a plain loop in this process on one torch thread
(bench/data_plane_loop.py), in the same run:
(a) carrier: the digits MLP carrying ResNet-18's 11.2M floats (a 45 MB state, bench/carrier_plugin.py),
    2 SGD steps per device: almost no compute, so the data plane is what is timed;
(b) resnet: `resnet18_fedrevive` on synthetic CIFAR-shaped data, a few Adam steps of batch 16;
(c) digits: the demo's MLP (kilobytes a state), as a control.
A sync run has a warm-up round, the timed rounds and a last round; FedBuff makes a version every
devices/2 updates with `devices` training at once, twice as many versions. Both are timed from the
store, first timed round's (version's) enqueue to the last timed one's aggregation, and compared per
update against the loop's same rounds: fedqueue / loop, and fedqueue / floor, the floor being the loop
spread over two cores (loop / 2). Beside them, what two cores allow here: two copies of the loop run at once,
one process each (the floor measured: they share memory bandwidth and caches; `--no-pair` skips it), and
the CPU per update of fedqueue's processes (workers, embedded Redis) against the loop's: 2 x loop CPU /
fedqueue CPU is the best speed-up over the loop that much CPU allows on two cores. Last, the loop once more
with its freed memory kept for reuse, as fedqueue's workers keep theirs (FEDQUEUE_WORKER_FREED_MEMORY_MB):
what that setting alone gives a loop, and fedqueue against it.

Per update, from the store's timing rows: the device task's load, compute and upload, and the
aggregation task; timed here on a state of the case's size with the library calls fedqueue makes
(bench/data_plane_phases.py): encode, sha256, Redis SET and GET, sha256 again, decode, the fold.
Bytes per update: the update blob, and Redis's network traffic over the run per device trained.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (  # noqa: E402
    BENCH_DIR,
    REPO,
    CpuSeries,
    ForeignLoad,
    machine,
    machine_line,
    markdown_table,
    verdict,
    wait_for_quiet,
    wait_run,
)
from data_plane_loop import Loop, LoopRun, run_mode, side_by_side  # noqa: E402
from data_plane_phases import PHASES, SHM_PHASES, PhaseCosts, phase_costs  # noqa: E402

from fedqueue.core.process.kept_memory import keep_freed_memory  # noqa: E402
from fedqueue.fl.config import RunConfig, load_run_config  # noqa: E402

MB = 1e6
TARGETS = {"carrier_over_loop": 1.6, "over_floor": 1.25, "data_plane_ms": 50.0}
MODES = ("fedavg", "fedbuff")
TITLES = {
    "carrier": "(a) carrier: digits MLP + ResNet-18's 11.2M floats",
    "resnet": "(b) resnet18_fedrevive, synthetic CIFAR",
    "digits": "(c) digits MLP (control)",
}


def cases(args: argparse.Namespace) -> dict[str, RunConfig]:
    rounds = args.timed_rounds + 2
    common = {"rounds": rounds, "eval_every": rounds, "seed": 0, "pack_size": args.pack_size}
    common["pack_mode"] = args.pack_mode
    carrier = {
        **common,
        "name": "bench-data-plane-carrier",
        "dataset": "digits",
        "model": "carrier_plugin:build",
        "num_devices": 100,
        "devices_per_round": args.carrier_devices,
        "local_iters": 2,
        "local_batch_size": 16,
        "local_lr": 0.05,
    }
    resnet = {
        **common,
        "name": "bench-data-plane-resnet",
        "dataset": "synthetic",
        "model": "resnet18_fedrevive",
        "num_devices": 4 * args.resnet_devices,
        "devices_per_round": args.resnet_devices,
        "samples_per_device": 64,
        "local_iters": args.resnet_steps,
        "local_batch_size": 16,
        "local_optimizer": "adam",
        "local_lr": 3e-4,
    }
    demo = {**common, "name": "bench-data-plane-digits", "devices_per_round": args.digits_devices}
    built = {
        "carrier": RunConfig.from_dict(carrier),
        "resnet": RunConfig.from_dict(resnet),
        "digits": load_run_config(REPO / "examples" / "digits_fedavg.toml", demo),
    }
    return {name: built[name] for name in args.cases}


def in_mode(config: RunConfig, mode: str) -> RunConfig:
    """FedBuff: `devices_per_round` training at once, a version every half of them, twice the versions."""
    if mode == "fedavg":
        return config
    devices = config.devices_per_round
    return RunConfig.from_dict(
        {
            **config.to_dict(),
            "name": f"{config.name}-fedbuff",
            "mode": "fedbuff",
            "concurrency": devices,
            "buffer_size": max(1, devices // 2),
            "max_model_version": 2 * config.rounds,
            "eval_every": 2 * config.rounds,
        }
    )


@dataclass
class Through:
    """One run through fedqueue: its timed span and what the store and Redis say about it."""

    seconds: float
    updates: int
    phases_ms: dict[str, float]  # per update
    blob_bytes: float  # update blob bytes per update
    redis_bytes: float  # Redis traffic in and out per device trained
    model_bytes: int
    packs: str
    weights: dict[str, Any] | None
    cpu_ms: float  # CPU of the workers and the embedded Redis, per update of the timed span


def redis_traffic(client: Any) -> int:
    stats = client.info("stats")
    return int(stats["total_net_input_bytes"]) + int(stats["total_net_output_bytes"])


def through_fedqueue(cluster: Any, config: RunConfig, client: Any, cpu: CpuSeries) -> Through:
    import fedqueue
    from fedqueue.fl.store.results import device_tasks, list_rounds

    traffic = redis_traffic(client)
    handle = fedqueue.submit(config, settings=cluster.settings)
    status = wait_run(handle, cluster)
    traffic = redis_traffic(client) - traffic
    if status["state"] != "finished":
        raise RuntimeError(f"{config.name}: run ended {status['state']}: {status['error']}")
    store = handle.store
    rounds = list_rounds(store, handle.id)[1:-1]
    began, ended = rounds[0].enqueued_at, rounds[-1].aggregated_at
    assert ended is not None
    timings = store.task_timings(handle.id)
    if config.mode != "fedavg":
        ended = min([ended, *next_version_began(timings, rounds[-1].round_index)])
    results = [row for row in device_tasks(store, handle.id) if row.state == "done"]
    timed = {row.round_index for row in rounds}
    if config.mode == "fedavg":
        updates = sum(1 for row in results if row.round_index in timed)
    else:
        updates = sum(1 for row in results if row.folded_into in timed)
    blobs = {row.update_key: row.update_nbytes or 0 for row in results if row.update_key}
    chosen = RunConfig.from_dict(store.get_run(handle.id).config)
    return Through(
        seconds=ended - began,
        updates=updates,
        phases_ms=store_phases(timings, began, ended, updates),
        blob_bytes=sum(blobs.values()) / len(results),
        redis_bytes=traffic / len(results),
        model_bytes=rounds[0].model_nbytes,
        packs=f"{chosen.packing.pack_mode} packs of {chosen.packing.pack_size}",
        weights=handle.final_weights() if config.mode == "fedavg" else None,
        cpu_ms=1000 * cpu.between(began, ended) / updates,
    )


def next_version_began(timings: list[Any], version: int) -> list[float]:
    """When the making of the version after `version` began (FedBuff: a round closes with its version).

    A fold pass stamps the versions it made at its save: one made in the same pass as the run's last version
    is stamped after that one was made and evaluated, which the loop never does. The timed span ends where
    the next version's making began.
    """
    return [row.started_at for row in timings if row.task_type == "aggregate" and row.round_index == version + 1]


def store_phases(timings: list[Any], began: float, ended: float, updates: int) -> dict[str, float]:
    """Milliseconds per update of each phase the store records, over the tasks that started in the span.

    A vmapped pack's devices share one timing: its phases count once, spread over its devices.
    """
    devices = 0
    tasks: dict[tuple[str, float], Any] = {}
    aggregation_ms = 0.0
    for row in timings:
        if row.state != "done" or not began <= row.started_at < ended:
            continue
        if row.task_type == "train":
            devices += 1
            tasks[(row.pack or row.task, row.started_at)] = row
        elif row.task_type == "aggregate":
            aggregation_ms += row.compute_ms
    phases: dict[str, float] = defaultdict(float)
    for row in tasks.values():
        for phase in ("load", "compute", "upload"):
            phases[phase] += getattr(row, f"{phase}_ms") / max(devices, 1)
    phases["aggregation"] = aggregation_ms / max(updates, 1)
    return dict(phases)


def max_difference(left: dict[str, Any] | None, right: dict[str, Any] | None) -> str:
    if left is None or right is None:
        return "-"
    return f"{max(float((left[name].double() - right[name].double()).abs().max()) for name in left):.1e}"


def main() -> None:
    import redis
    import torch

    import fedqueue
    from fedqueue.config import Settings

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default="carrier,resnet,digits")
    parser.add_argument("--modes", default="fedavg,fedbuff")
    parser.add_argument("--timed-rounds", type=int, default=2)
    parser.add_argument("--carrier-devices", type=int, default=10, help="devices per round (FedBuff: at once)")
    parser.add_argument("--resnet-devices", type=int, default=4)
    parser.add_argument("--resnet-steps", type=int, default=2, help="local steps of resnet18_fedrevive")
    parser.add_argument("--digits-devices", type=int, default=20)
    parser.add_argument("--procs", type=int, default=os.cpu_count() or 1, help="worker processes")
    parser.add_argument("--pack-size", default="auto", type=lambda v: v if v == "auto" else int(v))
    parser.add_argument("--pack-mode", default="auto", choices=["auto", "sequential", "vmap"])
    parser.add_argument("--repeats", type=int, default=3, help="tries of each phase timed in this process")
    parser.add_argument("--quick", action="store_true", help="a smoke run: small rounds, one timed round")
    parser.add_argument("--busy-ok", action="store_true", help="start at once on a busy machine")
    parser.add_argument("--phases-only", action="store_true", help="only time each phase of one update (seconds)")
    parser.add_argument("--no-pair", action="store_true", help="skip the loop run twice at once (the floor measured)")
    args = parser.parse_args()
    if args.quick:
        args.timed_rounds, args.carrier_devices, args.resnet_devices = 1, 4, 2
        args.resnet_steps, args.digits_devices, args.repeats = 1, 10, 1
    args.cases = [name for name in args.cases.split(",") if name]
    modes = [mode for mode in args.modes.split(",") if mode]
    torch.set_num_threads(1)  # the loop's one thread, and the phases timed here as a worker's task runs them

    print(machine_line(machine()))
    if not args.busy_ok:
        wait_for_quiet()
    print("load average at the start: {:.2f} {:.2f} {:.2f}".format(*os.getloadavg()), flush=True)
    load = ForeignLoad()
    if args.phases_only:
        phases_only(args)
        print("\n" + load.report())
        return
    configs = {name: {mode: in_mode(config, mode) for mode in modes} for name, config in cases(args).items()}
    runs: dict[tuple[str, str], Through] = {}
    with tempfile.TemporaryDirectory(prefix="fedqueue-bench-") as tmp:
        settings = Settings(database_url=f"sqlite:///{Path(tmp) / 'data-plane.db'}", key_prefix="bench-data-plane")
        settings = settings.with_plugin_path([str(BENCH_DIR)])
        with fedqueue.local_cluster(procs=args.procs, settings=settings) as cluster, CpuSeries() as cpu:
            assert cluster.settings.broker_url is not None
            client = redis.Redis.from_url(cluster.settings.broker_url)
            for name, by_mode in configs.items():
                for mode, config in by_mode.items():
                    print(f"{TITLES[name]}, {mode}: fedqueue ...", flush=True)
                    runs[name, mode] = through_fedqueue(cluster, config, client, cpu)
            # The workers are idle now: each phase timed alone on the case's state.
            costs = case_costs(cases(args), client, args.repeats)
    loops: dict[tuple[str, str], LoopRun] = {}
    pairs: dict[tuple[str, str], float] = {}
    for name, by_mode in configs.items():
        for mode, config in by_mode.items():
            print(f"{TITLES[name]}, {mode}: plain loop ...", flush=True)
            loops[name, mode] = run_mode(Loop(config), mode)
            if not args.no_pair:
                print(f"{TITLES[name]}, {mode}: two plain loops at once ...", flush=True)
                pairs[name, mode] = side_by_side(config, mode)
    # The loop again, keeping freed memory as fedqueue's workers do: what that setting alone gives a loop.
    kept: dict[tuple[str, str], LoopRun] = {}
    if keep_freed_memory(settings.worker_freed_memory_mb):
        for name, by_mode in configs.items():
            for mode, config in by_mode.items():
                print(f"{TITLES[name]}, {mode}: plain loop keeping freed memory ...", flush=True)
                kept[name, mode] = run_mode(Loop(config), mode)
    print("load average at the end: {:.2f} {:.2f} {:.2f}".format(*os.getloadavg()))
    report(args, configs, runs, loops, costs, pairs, kept)
    print("\n" + load.report())


def case_costs(configs: dict[str, RunConfig], client: Any, repeats: int) -> dict[str, PhaseCosts]:
    return {name: phase_costs(Loop(config).initial, client, "bench", repeats) for name, config in configs.items()}


def phases_only(args: argparse.Namespace) -> None:
    """Each phase of one update per case, through an embedded Redis of its own: no run, no loop."""
    import redis

    from fedqueue.queue.embedded import EmbeddedRedis

    with EmbeddedRedis() as embedded:
        costs = case_costs(cases(args), redis.Redis.from_url(embedded.url), args.repeats)
    print(f"\n### One update's data plane, ms, each phase timed alone here (median of {args.repeats})\n")
    print(phases_table(costs))
    print("\n" + markdown_table(["target", "measured", "target", ""], checks({}, {}, costs)))


def phases_table(costs: dict[str, PhaseCosts]) -> str:
    rows = [
        (
            TITLES[name],
            f"{cost.nbytes / MB:.1f}",
            *(f"{cost.ms[phase]:.1f}" for phase in PHASES),
            f"{cost.total_ms:.1f}",
        )
        for name, cost in costs.items()
    ]
    table = markdown_table(["case", "MB", *PHASES, "total"], rows)
    shm = [
        (
            TITLES[name],
            f"{cost.nbytes / MB:.1f}",
            *(f"{cost.shm_ms[phase]:.1f}" for phase in SHM_PHASES),
            f"{cost.shm_total_ms:.1f}",
            f"{cost.shm_cpu_ms:.1f}",
        )
        for name, cost in costs.items()
        if cost.shm_ms
    ]
    if not shm:
        return table
    header = ["case", "MB", *(f"shm {phase}" for phase in SHM_PHASES), "shm total", "CPU of write + map"]
    return f"Through Redis:\n\n{table}\n\nThrough shared memory (one host):\n\n{markdown_table(header, shm)}"


def report(
    args: argparse.Namespace,
    configs: dict[str, dict[str, RunConfig]],
    runs: dict[tuple[str, str], Through],
    loops: dict[tuple[str, str], LoopRun],
    costs: dict[str, PhaseCosts],
    pairs: dict[tuple[str, str], float],
    kept: dict[tuple[str, str], LoopRun],
) -> None:
    print(f"\n### Wall time per update, {args.procs} worker processes, {args.timed_rounds} timed rounds\n")
    print(wall_table(configs, runs, loops))
    if kept:
        print("\n### The loop keeping freed memory, as fedqueue's workers do (FEDQUEUE_WORKER_FREED_MEMORY_MB)\n")
        print(kept_table(runs, loops, kept))
    print("\n### What two cores allow: the loop twice at once, and the CPU each update costs\n")
    print(two_cores_table(runs, loops, pairs))
    print("\n### Per update, ms: the store's timing rows (fedqueue) and the loop's training alone\n")
    print(store_table(runs, loops))
    print(f"\n### One update's data plane, ms, each phase timed alone here (median of {args.repeats})\n")
    print(phases_table(costs))
    print("\n### Bytes moved per update (MB)\n")
    rows = [
        (
            f"{TITLES[name]}, {mode}",
            f"{run.model_bytes / MB:.1f}",
            f"{run.blob_bytes / MB:.1f}",
            f"{run.redis_bytes / MB:.1f}",
        )
        for (name, mode), run in runs.items()
    ]
    headers = ["case, mode", "model blob", "update blob per device", "Redis in + out per device trained"]
    print(markdown_table(headers, rows))
    print("\n" + markdown_table(["target", "measured", "target", ""], checks(runs, loops, costs)))


def kept_table(
    runs: dict[tuple[str, str], Through], loops: dict[tuple[str, str], LoopRun], kept: dict[tuple[str, str], LoopRun]
) -> str:
    """fedqueue against the plain loop and against the same loop with its freed memory kept for reuse."""
    rows = []
    for key, run in runs.items():
        if key not in kept:
            continue
        fq_ms, loop_ms = per_update_ms(run, loops[key])
        kept_ms = per_update_ms(run, kept[key])[1]
        rows.append(
            (
                f"{TITLES[key[0]]}, {key[1]}",
                f"{fq_ms:.0f}",
                f"{loop_ms:.0f}",
                f"{kept_ms:.0f}",
                f"{loop_ms / kept_ms:.2f}x",
                f"{kept_ms / fq_ms:.2f}x",
                f"{fq_ms / (kept_ms / 2):.2f}x",
            )
        )
    headers = [
        "case, mode",
        "fedqueue ms/update",
        "loop ms/update",
        "loop keeping freed memory",
        "that loop's speed-up",
        "that loop / fedqueue",
        "fedqueue / that loop's floor",
    ]
    return markdown_table(headers, rows)


def per_update_ms(run: Through, loop: LoopRun) -> tuple[float, float]:
    """Milliseconds per update of the timed part: fedqueue's, the loop's."""
    loop_s, loop_updates = loop.timed()
    return 1000 * run.seconds / run.updates, 1000 * loop_s / loop_updates


def at_once(config: RunConfig) -> int:
    """Devices training at once: a round's, or FedBuff's concurrency."""
    if config.mode == "fedavg":
        return config.devices_per_round
    from fedqueue.fl.strategy.fedbuff.section import FedBuffSection

    return config.strategy(FedBuffSection).resolved_concurrency(config)


def wall_table(
    configs: dict[str, dict[str, RunConfig]],
    runs: dict[tuple[str, str], Through],
    loops: dict[tuple[str, str], LoopRun],
) -> str:
    rows = []
    for (name, mode), run in runs.items():
        loop = loops[name, mode]
        fq_ms, loop_ms = per_update_ms(run, loop)
        rows.append(
            (
                f"{TITLES[name]}, {mode}",
                at_once(configs[name][mode]),
                f"{run.seconds:.1f} / {loop.timed()[0]:.1f}",
                f"{run.updates} / {loop.timed()[1]}",
                f"{fq_ms:.0f}",
                f"{loop_ms:.0f}",
                f"{fq_ms / loop_ms:.2f}x",
                f"{fq_ms / (loop_ms / 2):.2f}x",
                run.packs,
                max_difference(run.weights, loop.state),
            )
        )
    headers = [
        "case, mode",
        "devices at once",
        "timed s fedqueue / loop",
        "updates",
        "fedqueue ms/update",
        "loop ms/update",
        "fedqueue / loop",
        "fedqueue / floor",
        "fedqueue chose",
        "weights vs loop",
    ]
    return markdown_table(headers, rows)


def two_cores_table(
    runs: dict[tuple[str, str], Through], loops: dict[tuple[str, str], LoopRun], pairs: dict[tuple[str, str], float]
) -> str:
    """The floor measured (two copies of the loop at once share memory bandwidth and caches), and the best
    speed-up over the loop that fedqueue's CPU per update allows on two cores (2 x loop CPU / fedqueue CPU)."""
    rows = []
    for (name, mode), run in runs.items():
        loop = loops[name, mode]
        fq_ms, loop_ms = per_update_ms(run, loop)
        pair_ms = pairs.get((name, mode))
        loop_cpu = loop.timed_cpu_ms()
        rows.append(
            (
                f"{TITLES[name]}, {mode}",
                f"{loop_ms:.0f}",
                "-" if pair_ms is None else f"{pair_ms:.0f}",
                "-" if pair_ms is None else f"{2 * loop_ms / pair_ms:.2f}x",
                "-" if pair_ms is None else f"{fq_ms / (pair_ms / 2):.2f}x",
                f"{loop_cpu:.0f}",
                f"{run.cpu_ms:.0f}",
                f"{2 * loop_cpu / run.cpu_ms:.2f}x",
            )
        )
    headers = [
        "case, mode",
        "loop ms/update",
        "each of two loops at once",
        "two loops / one",
        "fedqueue / floor measured",
        "loop CPU ms/update",
        "fedqueue CPU ms/update",
        "best over the loop at that CPU",
    ]
    return markdown_table(headers, rows)


def store_table(runs: dict[tuple[str, str], Through], loops: dict[tuple[str, str], LoopRun]) -> str:
    rows = []
    for (name, mode), run in runs.items():
        train = loops[name, mode].train_ms
        phases = (f"{run.phases_ms.get(phase, 0.0):.0f}" for phase in ("load", "compute", "upload", "aggregation"))
        rows.append((f"{TITLES[name]}, {mode}", f"{sum(train) / len(train):.0f}", *phases))
    headers = ["case, mode", "loop: train", "task load", "task compute", "task upload", "aggregation task"]
    return markdown_table(headers, rows)


def checks(
    runs: dict[tuple[str, str], Through], loops: dict[tuple[str, str], LoopRun], costs: dict[str, PhaseCosts]
) -> list[tuple[str, str, str, str]]:
    """The issue's targets: the carrier 1.6x faster than the loop, the big cases within 1.25x of the floor,
    a 45 MB update's data plane under 50 ms."""
    rows = []
    for (name, mode), run in runs.items():
        fq_ms, loop_ms = per_update_ms(run, loops[name, mode])
        if name == "carrier":
            faster = loop_ms / fq_ms
            target = TARGETS["carrier_over_loop"]
            rows.append(
                (f"carrier, {mode}: loop / fedqueue", f"{faster:.2f}x", f">= {target}x", verdict(faster >= target))
            )
        if name in ("carrier", "resnet"):
            floor = fq_ms / (loop_ms / 2)
            target = TARGETS["over_floor"]
            rows.append(
                (f"{name}, {mode}: fedqueue / floor", f"{floor:.2f}x", f"<= {target}x", verdict(floor <= target))
            )
    for name, cost in costs.items():
        if name != "digits":
            target = TARGETS["data_plane_ms"]
            ok = cost.total_ms < target
            rows.append(
                (f"{name}: one update's data plane", f"{cost.total_ms:.1f} ms", f"< {target:.0f} ms", verdict(ok))
            )
            if cost.shm_ms:
                ok = cost.shm_total_ms < target
                measured = f"{cost.shm_total_ms:.1f} ms"
                rows.append((f"{name}: the same through shared memory", measured, f"< {target:.0f} ms", verdict(ok)))
    return rows


if __name__ == "__main__":
    main()
