"""Soak: 2,000 device tasks while a worker is SIGKILLed every few seconds.

Counts tasks lost (selected devices with no stored result) and updates counted
twice (checked by comparing the final weights, bit for bit, with the same
experiment computed in this process with no queue), and samples this
scheduler's peak RSS when 500 and 2,000 tasks are done.

    .venv/bin/python bench/soak.py [--rounds 20] [--per-round 100] [--kill-every 3]
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fedqueue.config import Settings  # noqa: E402
from fedqueue.fl import api  # noqa: E402
from fedqueue.fl.config import RunConfig  # noqa: E402
from fedqueue.fl.store.results import device_tasks, list_rounds  # noqa: E402
from fedqueue.queue.embedded import EmbeddedRedis  # noqa: E402
from tests.support.cli_inputs import cli_env  # noqa: E402
from tests.support.helpers import reference_final_state  # noqa: E402
from tests.support.reliability_support import ping_count, wait_until  # noqa: E402


def killer(launcher: subprocess.Popen[bytes], every_s: float, stop: threading.Event, kills: list[float]) -> None:
    """SIGKILL one `celery worker` under the launcher every `every_s` seconds."""
    rng = random.Random(0)
    while not stop.wait(every_s):
        children = [child for child in psutil.Process(launcher.pid).children() if child.is_running()]
        if children:
            victim = rng.choice(children)
            try:
                os.kill(victim.pid, signal.SIGKILL)
                kills.append(time.monotonic())
            except ProcessLookupError:
                pass


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--per-round", type=int, default=100)
    parser.add_argument("--kill-every", type=float, default=5.0)
    parser.add_argument("--procs", type=int, default=2)
    args = parser.parse_args()

    config = RunConfig.from_dict(
        {
            "dataset": "digits",
            "model": "mlp",
            "num_devices": 2 * args.per_round,
            "devices_per_round": args.per_round,
            "rounds": args.rounds,
            "local_iters": 10,
            "local_batch_size": 8,
            "local_lr": 0.1,
            "seed": 5,
        }
    )
    total = args.rounds * args.per_round
    workdir = Path(tempfile.mkdtemp(prefix="fedqueue-soak-"))
    with EmbeddedRedis() as redis_server:
        settings = Settings(
            broker_url=redis_server.url,
            database_url=f"sqlite:///{workdir / 'soak.db'}",
            heartbeat_ttl_s=3,
            lease_ttl_s=5,
            max_attempts=10,
        )
        log = open(workdir / "workers.log", "w")  # noqa: SIM115 - the launcher writes to it while it runs
        launcher = subprocess.Popen(
            [sys.executable, "-m", "fedqueue.cli", "worker", "--procs", str(args.procs)],
            env=cli_env(settings),
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        wait_until(lambda: ping_count(settings) >= args.procs, 120)
        stop, kills = threading.Event(), []
        this = psutil.Process()
        rss_at: dict[int, float] = {}
        peak = 0
        began = time.monotonic()
        try:
            handle = api.submit(config, settings=settings)
            threading.Thread(target=killer, args=(launcher, args.kill_every, stop, kills), daemon=True).start()
            with api.scheduling(handle) as scheduler:

                def tick() -> None:
                    nonlocal peak
                    scheduler.tick()
                    peak = max(peak, this.memory_info().rss)
                    if len(rss_at) == 2:
                        return
                    finished = len(device_tasks(handle.store, handle.id))
                    for mark in (500, total):
                        if finished >= mark and mark not in rss_at:
                            rss_at[mark] = peak / 2**20

                status = handle.wait(3600, poll_s=0.5, tick=tick)
            rss_at.setdefault(total, peak / 2**20)
        finally:
            stop.set()
            launcher.send_signal(signal.SIGTERM)
            launcher.wait(timeout=120)
            log.close()
        wall = time.monotonic() - began

    rows = device_tasks(handle.store, handle.id)
    done = [row for row in rows if row.state == "done"]
    expected = {(r.round_index, d) for r in list_rounds(handle.store, handle.id) for d in r.selected}
    lost = len(expected - {(row.round_index, row.device) for row in done})
    redone = sum(1 for row in done if row.attempt > 1)
    final, reference = handle.final_weights(), reference_final_state(config)
    same = final.keys() == reference.keys() and all(torch.equal(final[key], reference[key]) for key in final)
    print(f"machine: {os.cpu_count()} cores, {platform.processor() or platform.machine()}, CPU only")
    print(f"run {handle.id}: state {status['state']}, {len(done)} of {total} device tasks stored, wall {wall:.1f} s")
    print(f"workers SIGKILLed: {len(kills)} (every {args.kill_every} s); tasks redone after a kill: {redone}")
    print(f"tasks lost: {lost}; rows failed: {len(rows) - len(done)}")
    print(
        f"final weights equal the no-queue reference bit for bit: {same} (equal means no update was lost or counted twice)"
    )
    print(
        f"scheduler peak RSS: {rss_at.get(500, float('nan')):.1f} MiB at 500 tasks, "
        f"{rss_at[total]:.1f} MiB at {total} tasks"
    )


if __name__ == "__main__":
    main()
