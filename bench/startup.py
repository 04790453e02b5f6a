"""Start-up: how long `fedqueue run examples/digits_fedavg.toml` takes before its first round starts.

    .venv/bin/python bench/startup.py [--repeat 3] [--old-checkout DIR]

Each way is a fresh command in a fresh folder with no FEDQUEUE_* variable, with
fedqueue imported from the checkout this file is in, timed from the moment it is
started:

- first: `fedqueue run` starts its embedded Redis and local workers itself, the config's first
  run on the machine (an empty cache: the submit times the pack modes);
- cold: the same, with the pack mode remembered from an earlier run of the config;
- up: the same command beside a cluster `fedqueue up --detach` left running
  (`up` and `down` are timed apart);
- plain: the baseline, one Python process that runs the same experiment with
  fedqueue's own functions in a loop (imports, data, 10 rounds of 20 devices, an
  evaluation per round), no queue;
- old (with --old-checkout): `fedqueue run` from another checkout of fedqueue
  (e.g. a `git worktree` of an older commit), in this same run.

Three times per way: to the first device task's start (from the store's task
timings; for plain, its first training), to round 1's end, and to the command's
exit. The ways run --repeat times, every other time in reverse order; medians are
printed, with each way's ratio to plain.
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import REPO, ForeignLoad, machine, machine_line, markdown_table, ratio, verdict, wait_for_quiet  # noqa: E402

CONFIG = REPO / "examples" / "digits_fedavg.toml"
FEDQUEUE = [sys.executable, "-m", "fedqueue.cli"]
TARGET_FIRST_TASK_S = 3.0
EXPECTED_ACCURACY = "0.9331"
_CACHE = tempfile.TemporaryDirectory(prefix="fedqueue-startup-cache-")  # removed when the bench exits
BENCH_CACHE = Path(_CACHE.name)
Times = dict[str, float | None]


def clean_env(checkout: Path = REPO, cache: Path | None = None) -> dict[str, str]:
    """No FEDQUEUE_* variable, and fedqueue imported from `checkout` (this one unless told), workers too;
    the pack-mode cache in `cache` (the bench's own, remembered across its runs, unless told)."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("FEDQUEUE_")}
    env["PYTHONPATH"] = str(checkout)
    env["XDG_CACHE_HOME"] = str(cache or BENCH_CACHE)
    return env


def store_times(folder: Path, began: float) -> Times:
    """First device task start and round 1's end, from the run's store, as seconds after `began`."""
    with sqlite3.connect(folder / "fedqueue.db") as db:
        (first,) = db.execute("SELECT min(started_at) FROM task_timings WHERE round_index = 1").fetchone()
        (done,) = db.execute("SELECT aggregated_at FROM rounds WHERE round_index = 1").fetchone()
    return {"first_task": first - began, "round_1": done - began}


def time_run(folder: Path, env: dict[str, str]) -> Times:
    began = time.time()
    result = subprocess.run([*FEDQUEUE, "run", str(CONFIG)], cwd=folder, env=env, capture_output=True, text=True)
    ended = time.time()
    if result.returncode != 0 or f"final accuracy {EXPECTED_ACCURACY}" not in result.stdout:
        raise RuntimeError(f"fedqueue run failed or changed its result:\n{result.stdout}\n{result.stderr}")
    return {**store_times(folder, began), "whole": ended - began}


def time_plain() -> Times:
    began = time.time()
    result = subprocess.run(
        [sys.executable, __file__, "--plain-loop"], env=clean_env(), capture_output=True, text=True, check=True
    )
    ended = time.time()
    marks = json.loads(result.stdout.strip().splitlines()[-1])
    return {"first_task": marks["first_task"] - began, "round_1": marks["round_1"] - began, "whole": ended - began}


def plain_loop() -> None:
    """The demo in one process, no queue: what a user's own loop costs (run as a child, timed from outside)."""
    import torch

    from fedqueue.fl.config import load_run_config
    from fedqueue.fl.ml.aggregate import fedavg
    from fedqueue.fl.ml.data import device_data, load_federated
    from fedqueue.fl.ml.evaluate import evaluate
    from fedqueue.fl.ml.models import build_model, initial_state
    from fedqueue.fl.ml.seeding import task_seed
    from fedqueue.fl.ml.train import train_local
    from fedqueue.fl.setup import data_spec, train_config
    from fedqueue.fl.strategy.sync.rounds import select_devices

    torch.set_num_threads(1)  # as fedqueue's workers train
    config = load_run_config(CONFIG, {})
    spec = data_spec(config)
    data = load_federated(spec)
    state = initial_state(config.model, data.input_shape, data.num_classes, config.seed)
    marks: dict[str, float] = {}
    accuracy = 0.0
    for round_index in range(1, config.rounds + 1):
        updates = []
        for device in select_devices(config.seed, round_index, config.num_devices, config.devices_per_round):
            marks.setdefault("first_task", time.time())
            model = build_model(config.model, data.input_shape, data.num_classes)
            model.load_state_dict(state)
            seed = task_seed(config.seed, round_index, device)
            outcome = train_local(model, device_data(spec, device), train_config(config), seed, torch.device("cpu"))
            updates.append((device, outcome.samples, outcome.state))
        state = fedavg(state, updates, config.global_lr)
        model = build_model(config.model, data.input_shape, data.num_classes)
        model.load_state_dict(state)
        accuracy = evaluate(model, data.test, torch.device("cpu"))[0]
        marks.setdefault("round_1", time.time())
    print(json.dumps({**marks, "accuracy": accuracy}))


def fedqueue_command(args: list[str], folder: Path) -> float:
    began = time.monotonic()
    subprocess.run([*FEDQUEUE, *args], cwd=folder, env=clean_env(), capture_output=True, text=True, check=True)
    return time.monotonic() - began


def one_pass(ways: list[str], old: Path | None) -> tuple[dict[str, Times], dict[str, float]]:
    results: dict[str, Times] = {}
    extra: dict[str, float] = {}
    for way in ways:
        with tempfile.TemporaryDirectory(prefix="fedqueue-startup-") as name:
            folder = Path(name)
            if way == "plain":
                results[way] = time_plain()
            elif way == "cold":
                results[way] = time_run(folder, clean_env())
            elif way == "first":
                results[way] = time_run(folder, clean_env(cache=folder / "cache"))
            elif way == "old":
                assert old is not None
                results[way] = time_run(folder, clean_env(old))
            else:
                extra["up"] = fedqueue_command(["up", "--detach"], folder)
                try:
                    results[way] = time_run(folder, clean_env())
                finally:
                    extra["down"] = fedqueue_command(["down"], folder)
    return results, extra


def median(values: list[float | None]) -> float | None:
    known = [value for value in values if value is not None]
    return statistics.median(known) if known else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--old-checkout", type=Path, help="another fedqueue checkout to time as the 'old' way")
    parser.add_argument("--plain-loop", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.plain_loop:
        plain_loop()
        return
    ways = ["plain", "first", "cold", "up"] + (["old"] if args.old_checkout else [])
    info = machine()
    print(machine_line(info), flush=True)
    wait_for_quiet()
    with tempfile.TemporaryDirectory(prefix="fedqueue-startup-") as name:  # untimed: the pack mode remembered
        time_run(Path(name), clean_env())
    load = ForeignLoad()
    runs: dict[str, list[Times]] = {way: [] for way in ways}
    extras: dict[str, list[float]] = {"up": [], "down": []}
    for repeat in range(args.repeat):
        order = ways if repeat % 2 == 0 else ways[::-1]
        results, extra = one_pass(order, args.old_checkout)
        for way, times in results.items():
            runs[way].append(times)
        for what, seconds in extra.items():
            extras[what].append(seconds)
        print(f"pass {repeat + 1}: " + json.dumps({way: results[way] for way in ways}, default=_rounded), flush=True)
    print_results(ways, runs, extras, args.repeat, load)


def _rounded(value: Any) -> Any:
    return round(value, 2) if isinstance(value, float) else value


def print_results(
    ways: list[str], runs: dict[str, list[Times]], extras: dict[str, list[float]], repeat: int, load: ForeignLoad
) -> None:
    medians = {way: {key: median([times[key] for times in runs[way]]) for key in runs[way][0]} for way in ways}
    plain = medians["plain"]
    rows = []
    for way in ways:
        row = medians[way]
        rows.append(
            [
                way,
                *(f"{row[key]:.2f}" if row[key] is not None else "–" for key in ("first_task", "round_1", "whole")),
                ratio(row["first_task"], plain["first_task"]),
                ratio(row["whole"], plain["whole"]),
            ]
        )
    print()
    print(f"medians of {repeat} passes, seconds from the command's start:")
    print(
        markdown_table(
            ["way", "first task starts", "round 1 done", "command ends", "first task / plain", "whole / plain"], rows
        )
    )
    print(
        f"fedqueue up --detach: {median(list(extras['up'])) or 0:.2f} s · fedqueue down: "
        f"{median(list(extras['down'])) or 0:.2f} s (medians)"
    )
    for way in ("first", "cold", "up"):
        first = medians[way]["first_task"]
        ok = first is not None and first <= TARGET_FIRST_TASK_S
        print(f"{way}: first task within {TARGET_FIRST_TASK_S:.0f} s of the command: {verdict(ok)}")
    print(load.report())


if __name__ == "__main__":
    main()
