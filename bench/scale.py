"""Cross-device scale: what grows with the simulated devices and with the devices training at once.

    .venv/bin/python bench/scale.py [--devices 1000,10000,100000,1000000] [--concurrency 10,100,1000]
                                    [--modes sync,fedbuff] [--versions 10] [--procs 2] [--quick]

Every case is a fresh cluster that `fedqueue up --detach` started in a temporary folder (its own embedded
Redis, a SQLite store there, local workers), then `fedqueue run` of the digits MLP on FedRevive's fixed
overlapping shards (`partition = "dirichlet_fixed"`, 20 samples a device), timed from the command's start:

- first task: when the run's first device task started (the store's task timings), and from it to version 1;
- per update: the span from the first task to the last version (round), over the updates it folded;
- version 1 and later versions: when version 1 was made, and the median time between two later ones;
- memory: peak resident set of the `fedqueue run` process (the run's follower) and of the largest worker,
  polled every 20 ms; Redis's `used_memory`, polled, its peak above the idle cluster's; the store's file
  (SQLite and its WAL) after the run; and every process of the cluster and the run (the follower and what it
  starts) together, their resident sets summed and their proportional sets (shared pages shared out) summed,
  polled every 250 ms: at any time, and while the follower follows (the submit's own process gone).

Modes: `fedbuff` (`concurrency` devices at once, a version every `buffer` updates: max(10, concurrency / 10)
unless --buffer says) and `sync` (rounds of `concurrency` devices, as many updates). Each case has the same
number of versions (--versions), so the same updates at a given concurrency.

Baselines, in the same run: the training floor, a device's local training timed in this process with
fedqueue's own functions (no queue) times the updates over the worker slots; and the case with the fewest
devices of the same mode and concurrency. Every time is printed with its ratio to both, every memory with
its ratio to the fewest devices.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shutil
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (
    REPO,
    ForeignLoad,
    PeakWatcher,
    RssWatcher,
    machine,
    machine_line,
    markdown_table,
    ratio,
    tree_cpu_s,
    wait_for_quiet,
)  # noqa: E402

MiB = 1024 * 1024
FEDQUEUE = [sys.executable, "-m", "fedqueue.cli"]
# The digits MLP of examples/digits_fedbuff.toml on FedRevive's fixed shards of 20 samples: a device trains
# 50 small steps, so what the queue does per update is not hidden behind the training.
BASE_CONFIG: dict[str, Any] = {
    "dataset": "digits",
    "model": "mlp",
    "partition": "dirichlet_fixed",
    "client_data_size": 20,
    "local_epochs": 10,
    "local_batch_size": 4,
    "local_optimizer": "sgd",
    "local_lr": 0.2,
    "eval_every": 1,
    "seed": 0,
}
FLOOR_DEVICES = 30  # devices timed for the training floor


@dataclass(frozen=True)
class Case:
    mode: str
    devices: int
    concurrency: int
    versions: int
    buffer: int

    @property
    def updates(self) -> int:
        return self.versions * self.per_version

    @property
    def per_version(self) -> int:
        """Updates per version (FedBuff's buffer) or per round (sync: every device of the round)."""
        return self.buffer if self.mode == "fedbuff" else self.concurrency

    def config(self, extra: dict[str, Any]) -> dict[str, Any]:
        config = {**BASE_CONFIG, "name": f"scale-{self.mode}-{self.devices}-{self.concurrency}"}
        config["num_devices"] = self.devices
        if self.mode == "fedbuff":
            config.update(
                mode="fedbuff",
                concurrency=self.concurrency,
                buffer_size=self.buffer,
                max_model_version=self.versions,
            )
        else:
            config.update(mode="fedavg", devices_per_round=self.concurrency, rounds=self.versions)
        return {**config, **extra}

    def label(self) -> str:
        return f"{self.mode} {self.devices:,} devices, {self.concurrency:,} at once"


def toml_text(config: dict[str, Any]) -> str:
    """Flat TOML of strings, numbers and booleans (json's quoting is TOML's for these)."""
    return "".join(f"{key} = {json.dumps(value)}\n" for key, value in config.items())


class RedisMemory(PeakWatcher):
    """Peak `used_memory` of a Redis, polled every 200 ms (INFO's own peak is never reset)."""

    def __init__(self, url: str, every_s: float = 0.2) -> None:
        import redis

        self._client = redis.Redis.from_url(url)
        super().__init__(every_s)

    def _read(self) -> int:
        import redis

        try:
            return int(self._client.info("memory")["used_memory"])
        except redis.RedisError:  # the cluster going away: the peak so far stands
            return 0

    def __exit__(self, *exc: object) -> None:
        super().__exit__(*exc)
        self._client.close()


class AllMemory:
    """Peak memory of every process of the run, summed: the cluster's (`fedqueue up`, its workers, its Redis) and
    the follower's with whatever it starts (the process that prepares the submit), polled every 250 ms. Resident
    sets count the pages the processes share (torch's libraries) once in each; proportional sets share them out.
    The `following` peaks leave out the readings while the follower had a child process (the submit's
    preparation): what the run holds while it runs."""

    def __init__(self, roots: list[int], every_s: float = 0.25) -> None:
        import threading

        self._roots, self._every_s = roots, every_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self.peak_rss = self.peak_pss = self.following_rss = self.following_pss = 0

    def _poll(self) -> None:
        while True:
            self._read()
            if self._stop.wait(self._every_s):
                return

    def _read(self) -> None:
        import psutil

        rss = pss = 0
        seen: set[int] = set()
        preparing = False
        for index, root in enumerate(self._roots):
            with contextlib.suppress(psutil.Error):
                top = psutil.Process(root)
                below = top.children(recursive=True)
                preparing = preparing or (index > 0 and bool(below))  # the follower's own children
                for process in [top, *below]:
                    if process.pid in seen:
                        continue
                    seen.add(process.pid)
                    with contextlib.suppress(psutil.Error):
                        info = process.memory_full_info()
                        rss, pss = rss + info.rss, pss + info.pss
        self.peak_rss, self.peak_pss = max(self.peak_rss, rss), max(self.peak_pss, pss)
        if not preparing:
            self.following_rss, self.following_pss = max(self.following_rss, rss), max(self.following_pss, pss)

    def add(self, pid: int) -> None:
        self._roots = [*self._roots, pid]

    def __enter__(self) -> AllMemory:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def case_env(folder: Path, cache: Path) -> dict[str, str]:
    """No FEDQUEUE_* variable (the folder's SQLite store, `fedqueue up`'s embedded Redis), fedqueue from this
    checkout, and the cluster's announcement, logs and pack-mode cache inside the bench's folders."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("FEDQUEUE_")}
    runtime = folder / "runtime"
    runtime.mkdir(mode=0o700)
    env.update(
        PYTHONPATH=str(REPO),
        XDG_RUNTIME_DIR=str(runtime),
        XDG_STATE_HOME=str(folder / "state"),
        XDG_CACHE_HOME=str(cache),
    )
    return env


def cluster_info(folder: Path) -> dict[str, Any]:
    (path,) = (folder / "runtime").glob(f"fedqueue-{os.getuid()}/cluster-*.json")
    info: dict[str, Any] = json.loads(path.read_text())
    return info


def worker_pids(up_pid: int) -> list[int]:
    """The worker processes below the `fedqueue up` process (its embedded Redis left out)."""
    import psutil

    below = psutil.Process(up_pid).children(recursive=True)
    return [child.pid for child in below if "redis" not in " ".join(child.cmdline())]


def store_bytes(folder: Path) -> int:
    return sum(path.stat().st_size for path in folder.glob("fedqueue.db*"))


def stop_cluster(folder: Path, env: dict[str, str], up_pid: int | None) -> None:
    """`fedqueue down`; the `up` process group killed if it is still there after."""
    subprocess.run([*FEDQUEUE, "down"], cwd=folder, env=env, capture_output=True, timeout=120)
    if up_pid is None:
        return
    try:
        os.killpg(up_pid, 0)
    except ProcessLookupError:
        return
    os.killpg(up_pid, signal.SIGKILL)  # `up` runs in a session of its own, with its workers and Redis


def run_case(
    case: Case, folder: Path, cache: Path, procs: int, extra: dict[str, Any], timeout_s: float, load: ForeignLoad
) -> dict[str, Any]:
    env = case_env(folder, cache)
    (folder / "scale.toml").write_text(toml_text(case.config(extra)))
    up_began = time.monotonic()
    subprocess.run(
        [*FEDQUEUE, "up", "--detach", f"--procs={procs}"],
        cwd=folder,
        env=env,
        check=True,
        capture_output=True,
        timeout=300,
    )
    up_s = time.monotonic() - up_began
    info = cluster_info(folder)
    try:
        device_s = training_floor(case, extra)  # timed here, beside the idle cluster: the load of the case's time
        workers = worker_pids(info["pid"])
        store_before = store_bytes(folder)
        with (
            RedisMemory(info["broker_url"]) as redis_memory,
            RssWatcher(workers) as worker_rss,
            AllMemory([info["pid"]]) as all_memory,
        ):
            began = time.time()
            with open(folder / "run.log", "wb") as log:
                follower = subprocess.Popen(
                    [*FEDQUEUE, "run", "scale.toml"], cwd=folder, env=env, stdout=log, stderr=subprocess.STDOUT
                )
                all_memory.add(follower.pid)
                with RssWatcher([follower.pid]) as follower_rss:
                    try:
                        code = follower.wait(timeout=timeout_s)
                    except subprocess.TimeoutExpired:
                        follower.kill()
                        follower.wait()
                        raise RuntimeError(f"{case.label()}: still running after {timeout_s:.0f} s") from None
            ended = time.time()
        if code != 0:
            tail = (folder / "run.log").read_text(errors="replace").strip().splitlines()[-5:]
            raise RuntimeError(f"{case.label()}: fedqueue run exited {code}:\n" + "\n".join(tail))
        measured = store_times(folder, began)
        slots = sum(int(value) for value in info["slots"].values())
        return {
            **measured,
            "whole_s": ended - began,
            "device_s": device_s,
            "up_s": up_s,
            "slots": slots,
            "all_rss_bytes": all_memory.peak_rss,
            "all_pss_bytes": all_memory.peak_pss,
            "following_rss_bytes": all_memory.following_rss,
            "following_pss_bytes": all_memory.following_pss,
            "follower_bytes": follower_rss.peak_bytes,
            "worker_bytes": worker_rss.peak_bytes,
            "redis_bytes": redis_memory.peak_bytes - redis_memory.base_bytes,
            "store_bytes": store_bytes(folder) - store_before,
        }
    finally:
        # The detached cluster is this benchmark's own work, not other work on the machine: counted before it stops.
        load.add_own(tree_cpu_s(info["pid"]))
        stop_cluster(folder, env, info["pid"])


def store_times(folder: Path, began: float) -> dict[str, Any]:
    """The run's marks from its store, in seconds after `began`."""
    with sqlite3.connect(folder / "fedqueue.db") as db:
        ((run_id, config_text),) = db.execute("SELECT id, config FROM runs").fetchall()
        (first, tasks) = db.execute(
            "SELECT min(started_at), count(*) FROM task_timings WHERE run_id = ? AND task_type = 'train'", (run_id,)
        ).fetchone()
        rounds = db.execute(
            "SELECT round_index, aggregated_at FROM rounds WHERE run_id = ? AND aggregated_at IS NOT NULL"
            " ORDER BY round_index",
            (run_id,),
        ).fetchall()
    config = json.loads(config_text)
    made = [at for _, at in rounds]
    between = [later - earlier for earlier, later in zip(made[1:], made[2:], strict=False)]
    return {
        "run_id": run_id,
        "tasks": tasks,
        "pack": f"{config.get('pack_size')} {config.get('pack_mode')}",
        "versions_made": len(made),
        "first_task_s": first - began,
        "version_1_s": made[0] - began if made else math.nan,
        "later_version_s": statistics.median(between) if between else math.nan,
        "after_first_s": made[-1] - first if made else math.nan,
    }


def training_floor(case: Case, extra: dict[str, Any]) -> float:
    """Seconds one device's local training takes here, fedqueue's functions in a loop (median of a few)."""
    import torch

    from fedqueue.fl.config import RunConfig
    from fedqueue.fl.ml.data import device_data, load_federated
    from fedqueue.fl.ml.models import build_model, initial_state
    from fedqueue.fl.ml.seeding import task_seed
    from fedqueue.fl.ml.train import train_local
    from fedqueue.fl.setup import data_spec, train_config

    torch.set_num_threads(1)  # as fedqueue's workers train
    config = RunConfig.from_dict(case.config(extra))
    spec = data_spec(config)
    data = load_federated(spec)
    state = initial_state(config.model, data.input_shape, data.num_classes, config.seed)
    times = []
    for device in range(FLOOR_DEVICES):
        began = time.perf_counter()
        model = build_model(config.model, data.input_shape, data.num_classes)
        model.load_state_dict(state)
        train_local(
            model, device_data(spec, device), train_config(config), task_seed(0, 1, device), torch.device("cpu")
        )
        times.append(time.perf_counter() - began)
    return statistics.median(times[FLOOR_DEVICES // 3 :])  # the first steps warm torch up


def parse_ints(text: str) -> list[int]:
    return [int(part.replace("_", "")) for part in text.split(",") if part.strip()]


def parse_sets(pairs: list[str]) -> dict[str, Any]:
    extra: dict[str, Any] = {}
    for pair in pairs:
        key, _, value = pair.partition("=")
        try:
            extra[key.strip()] = json.loads(value)
        except json.JSONDecodeError:
            extra[key.strip()] = value
    return extra


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--devices", default="1000,10000,100000,1000000", help="simulated devices, comma-separated")
    parser.add_argument("--concurrency", default="10,100,1000", help="devices training at once, comma-separated")
    parser.add_argument("--modes", default="sync,fedbuff", help="sync, fedbuff or both")
    parser.add_argument("--versions", type=int, default=10, help="versions (rounds) per run")
    parser.add_argument("--buffer", type=int, help="FedBuff's updates per version (default: max(10, at once / 10))")
    parser.add_argument("--procs", type=int, default=os.cpu_count() or 1, help="worker processes")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="more config (JSON values)")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds one run may take")
    parser.add_argument("--quick", action="store_true", help="a smoke: 1,000 devices, 10 at once, 3 versions")
    parser.add_argument("--busy-ok", action="store_true", help="start at once on a busy machine")
    args = parser.parse_args()
    # A stop (Ctrl-C, also where a background shell ignores it, or SIGTERM) still takes the case's cluster down
    # and removes the folders.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _stopped)
    if args.quick:
        args.devices, args.concurrency, args.versions = "1000", "10", 3
    extra = parse_sets(args.set)
    cases = [
        Case(mode, devices, concurrency, args.versions, args.buffer or max(10, concurrency // 10))
        for mode in args.modes.split(",")
        for concurrency in parse_ints(args.concurrency)
        for devices in parse_ints(args.devices)
    ]
    print(machine_line(machine()), flush=True)
    if not args.busy_ok:
        wait_for_quiet()
    load_before = os.getloadavg()
    load = ForeignLoad()
    device_s = training_floor(cases[0], extra)  # warms torch up; each case times it again before its command
    print(f"a device's local training (the floor's unit): {1000 * device_s:.1f} ms", flush=True)
    results: dict[Case, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="fedqueue-scale-") as name:
        root = Path(name)
        cache = root / "cache"
        for index, case in enumerate(cases):
            folder = root / f"case-{index}"
            folder.mkdir()
            print(f"{case.label()}: {case.updates:,} updates ...", flush=True)
            results[case] = run_case(case, folder, cache, args.procs, extra, args.timeout, load)
            print("  " + json.dumps(results[case], default=_rounded), flush=True)
            shutil.rmtree(folder, ignore_errors=True)  # a million devices' store is not kept for the next case
    print_results(results, args.procs)
    print(f"load average: {_loads(load_before)} before, {_loads(os.getloadavg())} after")
    print(load.report())


def _stopped(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)


def _loads(values: tuple[float, float, float]) -> str:
    return " / ".join(f"{value:.2f}" for value in values)


def _rounded(value: Any) -> Any:
    return round(value, 3) if isinstance(value, float) else value


def print_results(results: dict[Case, dict[str, Any]], procs: int) -> None:
    def baseline(case: Case) -> dict[str, Any]:
        same = [other for other in results if (other.mode, other.concurrency) == (case.mode, case.concurrency)]
        return results[min(same, key=lambda other: other.devices)]

    time_rows, memory_rows = [], []
    for case, r in results.items():
        base = baseline(case)
        slots, device_s = r["slots"], r["device_s"]
        version_floor = case.per_version * device_s / slots
        update_floor = device_s / slots
        per_update = r["after_first_s"] / case.updates
        base_update = base["after_first_s"] / case.updates
        time_rows.append(
            [
                case.mode,
                f"{case.devices:,}",
                f"{case.concurrency:,}",
                f"{r['versions_made']} x {case.per_version}",
                r["pack"],
                f"{1000 * device_s:.0f}",
                f"{r['first_task_s']:.2f}",
                ratio(r["first_task_s"], base["first_task_s"]),
                f"{r['version_1_s']:.2f}",
                f"{r['version_1_s'] - r['first_task_s']:.2f}",
                f"{r['later_version_s']:.2f}",
                ratio(r["later_version_s"], version_floor),
                f"{1000 * per_update:.1f}",
                ratio(per_update, base_update),
                ratio(per_update, update_floor),
                f"{r['whole_s']:.1f}",
            ]
        )
        memory_rows.append(
            [
                case.mode,
                f"{case.devices:,}",
                f"{case.concurrency:,}",
                *(
                    cell
                    for key in (
                        "follower_bytes",
                        "worker_bytes",
                        "redis_bytes",
                        "store_bytes",
                        "all_rss_bytes",
                        "all_pss_bytes",
                        "following_rss_bytes",
                        "following_pss_bytes",
                    )
                    for cell in (f"{r[key] / MiB:.1f}", ratio(r[key], base[key]))
                ),
            ]
        )
    print(
        f"\nseconds from the `fedqueue run` command's start; {procs} worker processes; training floor: a device's"
        " local training in one process (device ms, timed before each case) over the worker slots\n"
    )
    print(
        markdown_table(
            [
                "mode",
                "devices",
                "at once",
                "versions x updates",
                "pack",
                "device ms",
                "first task s",
                "vs fewest devices",
                "version 1 s",
                "first task to version 1 s",
                "later version s",
                "vs floor",
                "per update ms",
                "vs fewest devices",
                "vs floor",
                "command s",
            ],
            time_rows,
        )
    )
    print(
        "\npeak memory (MiB): the follower's and the largest worker's resident set, Redis's rise, the store's growth;"
        " every process of the cluster and the run together (resident sets summed, and proportional sets summed),"
        " at any time and while the follower follows (no submit process beside it)\n"
    )
    print(
        markdown_table(
            [
                "mode",
                "devices",
                "at once",
                "follower",
                "vs fewest",
                "worker",
                "vs fewest",
                "Redis",
                "vs fewest",
                "store",
                "vs fewest",
                "all RSS",
                "vs fewest",
                "all PSS",
                "vs fewest",
                "following RSS",
                "vs fewest",
                "following PSS",
                "vs fewest",
            ],
            memory_rows,
        )
    )


if __name__ == "__main__":
    main()
