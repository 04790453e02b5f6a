"""fedqueue as a user gets it (the default "auto" packing) against every tuned setting, on three workloads.

    .venv/bin/python bench/defaults.py [--timed-rounds 3] [--procs N] [--case all|demo|cnn|digits200]

Workloads, each run in one go on one local cluster (one worker process per core):
(1) the demo config (examples/digits_fedavg.toml: digits MLP, 20 of 100 devices a round);
(2) the CIFAR-shaped CNN: 32 devices x 20 steps of batch 32 on synthetic CIFAR-shaped data;
(3) the digits MLP with 200 of 1,000 devices a round.

Ways: a plain loop in one process (the baseline), fedqueue with one device per task, with
sequential packs and with vmapped packs (both of the size "auto" picks: two packs per slot),
and fedqueue with nothing set (pack_size = pack_mode = "auto", chosen at submit). Seconds per
round are from the store (first timed round's enqueue to the last timed round's aggregation),
after a warm-up round and before the last. Target: the defaults within 1.1x of the best tuned way.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import ForeignLoad, machine, machine_line, markdown_table, ratio, verdict, wait_for_quiet  # noqa: E402
from packing import Way, cnn_case, plain_loop, through_fedqueue  # noqa: E402

from fedqueue.fl.config import RunConfig, load_run_config  # noqa: E402
from fedqueue.fl.packs.rules import auto_pack_size  # noqa: E402

TARGET = 1.1  # defaults / best tuned way
REPO = Path(__file__).resolve().parents[1]


def workloads(timed: int) -> dict[str, RunConfig]:
    rounds = timed + 2
    demo = load_run_config(REPO / "examples" / "digits_fedavg.toml", {"rounds": rounds, "name": "bench-defaults-demo"})
    digits = replace(demo, name="bench-defaults-digits200", num_devices=1000, devices_per_round=200, eval_every=rounds)
    cnn = replace(cnn_case(timed, devices=32, steps=20), name="bench-defaults-cnn")
    return {"demo": demo, "cnn": cnn, "digits200": digits}


TITLES = {
    "demo": "(1) demo: digits MLP, 20 of 100 devices",
    "cnn": "(2) CIFAR-shaped CNN, 32 devices x 20 steps of batch 32",
    "digits200": "(3) digits MLP, 200 of 1,000 devices",
}


def run_case(cluster: object, config: RunConfig, procs: int) -> tuple[list[Way], RunConfig]:
    size = auto_pack_size(config.devices_per_round, procs)
    ways = [
        through_fedqueue(cluster, config.with_keys(pack_size=1, pack_mode="sequential"), "fedqueue, 1 device per task"),
        through_fedqueue(
            cluster, config.with_keys(pack_size=size, pack_mode="sequential"), f"sequential packs of {size}"
        ),
        through_fedqueue(cluster, config.with_keys(pack_size=size, pack_mode="vmap"), f"vmapped packs of {size}"),
        through_fedqueue(cluster, config, "fedqueue defaults (auto)"),
    ]
    handle = ways[-1].run
    return ways, RunConfig.from_dict(handle.store.get_run(handle.id).config)


def main() -> None:
    import fedqueue
    from fedqueue.config import Settings

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--timed-rounds", type=int, default=3)
    parser.add_argument("--procs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--case", choices=["all", *TITLES], default="all")
    args = parser.parse_args()
    print(machine_line(machine()))
    wait_for_quiet()
    load = ForeignLoad()
    cases = {name: config for name, config in workloads(args.timed_rounds).items() if args.case in ("all", name)}
    results = {}
    with tempfile.TemporaryDirectory(prefix="fedqueue-bench-") as tmp:
        settings = Settings(database_url=f"sqlite:///{Path(tmp) / 'defaults.db'}", key_prefix="bench-defaults")
        with fedqueue.local_cluster(procs=args.procs, settings=settings) as cluster:
            for name, config in cases.items():
                print(f"{TITLES[name]}: fedqueue ...", flush=True)
                results[name] = run_case(cluster, config, args.procs)
    summary = []
    for name, (ways, chosen) in results.items():
        print(f"{TITLES[name]}: plain loop ...", flush=True)
        loop = plain_loop(cases[name])
        tuned, defaults = ways[:-1], ways[-1]
        best = min(tuned, key=lambda way: way.seconds)
        print(f"\n### {TITLES[name]}, {args.timed_rounds} timed rounds, {args.procs} worker processes\n")
        rows = [
            (way.label, f"{way.seconds:.3f}", ratio(loop.seconds, way.seconds), ratio(way.seconds, best.seconds))
            for way in [loop, *ways]
        ]
        print(markdown_table(["way", "s per round", "loop / way", "way / best tuned"], rows))
        print(
            f"\nauto chose pack_size {chosen.packing.pack_size}, pack_mode {chosen.packing.pack_mode}: {chosen.packing.pack_choice}"
        )
        measured = defaults.seconds / best.seconds
        summary.append((TITLES[name], f"{measured:.2f}x ({best.label})", f"<= {TARGET}x", verdict(measured <= TARGET)))
    print("\n" + markdown_table(["defaults / best tuned", "measured", "target", ""], summary))
    print("\n" + load.report())


if __name__ == "__main__":
    main()
