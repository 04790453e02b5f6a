"""A worker whose broker fills up to its maxmemory (filled by someone else) waits for room instead of exiting.

Celery's consumer writes to Redis on every delivery (the unacked hash); a Redis at its limit refuses that with
a reply error, which Celery counts as fatal unless told to retry it as a lost connection. Here the worker is
frozen, the run's tasks are queued, Redis is filled to its limit, and the worker is thawed into it: it must
keep its process, and once the junk is gone the run ends with the reference weights.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from dataclasses import replace
from pathlib import Path

import psutil
import pytest
import redis

from fedqueue.config import Settings
from fedqueue.fl import api
from fedqueue.queue.embedded import EmbeddedRedis
from tests.support.cli_inputs import cli_env
from tests.support.cli_runner import start_fedqueue_cli
from tests.support.helpers import assert_same_weights, reference_final_state
from tests.support.reliability_support import (
    launcher,
    ping_count,
    reliable_settings,
    slow_config,
    stop_launcher,
    wait_until,
    worker_children,
)

pytestmark = pytest.mark.faults


def fill(client: redis.Redis) -> int:
    """Junk keys until Redis refuses a write; returns how many went in."""
    count = 0
    try:
        while True:
            client.set(f"junk:{count}", b"x" * 65536)
            count += 1
    except redis.exceptions.OutOfMemoryError:
        return count


def oom_replies(client: redis.Redis) -> int:
    """Writes Redis refused for want of memory so far (its own count, by error code)."""
    stats = client.info("errorstats")
    return int(stats.get("errorstat_OOM", {}).get("count", 0))


def test_a_worker_thawed_into_a_full_broker_waits_for_room_and_the_run_ends_the_same(
    settings: Settings, tmp_path: Path
) -> None:
    server = EmbeddedRedis(extra_args=["--maxmemory", "32mb", "--maxmemory-policy", "noeviction"]).start()
    client = redis.Redis.from_url(server.url)
    settings = reliable_settings(replace(settings, broker_url=server.url))
    config = slow_config(0.05, rounds=2, devices_per_round=4, local_iters=3)
    try:
        with launcher(settings, procs=1, cwd=tmp_path) as workers:
            (worker,) = worker_children(workers)
            os.kill(worker.pid, signal.SIGSTOP)
            handle = api.submit(config, settings=settings)  # its first round waits on the queue
            junk = fill(client)
            os.kill(worker.pid, signal.SIGCONT)
            # Thawed, it takes a message and meets the refusal (its delivery then waits for room, with a growing
            # pause): it must stay up through it.
            with api.scheduling(handle) as scheduler:
                refused = oom_replies(client)
                wait_until(lambda: oom_replies(client) > refused, 60, scheduler.tick)
                assert worker.is_running() and worker.status() != psutil.STATUS_ZOMBIE
                client.delete(*[f"junk:{index}" for index in range(junk)])
                status = handle.wait(180, tick=scheduler.tick)
            assert worker_children(workers) == [worker], "the worker was restarted: it exited on the full broker"
        log = "".join(path.read_text() for path in tmp_path.glob("launcher-*.log"))
    finally:
        client.close()
        server.stop()
    assert status["state"] == "finished", status
    assert "Unrecoverable error" not in log, log[-3000:]
    assert_same_weights(handle.final_weights(), reference_final_state(config))


def test_a_submit_into_a_full_broker_waits_for_room_and_the_run_ends_the_same(
    settings: Settings, tmp_path: Path
) -> None:
    """Redis full when the run is submitted: the submit waits (no error, no half-sent round) until room is made."""
    server = EmbeddedRedis(extra_args=["--maxmemory", "32mb", "--maxmemory-policy", "noeviction"]).start()
    client = redis.Redis.from_url(server.url)
    settings = reliable_settings(replace(settings, broker_url=server.url))
    config = slow_config(0.0, rounds=2, devices_per_round=4, local_iters=3)
    try:
        with launcher(settings, procs=1, cwd=tmp_path):
            junk = fill(client)
            refused = oom_replies(client)

            def make_room() -> None:  # once the submit was refused twice, as an operator clearing Redis
                wait_until(lambda: oom_replies(client) >= refused + 2, 60)
                client.delete(*[f"junk:{index}" for index in range(junk)])

            clearer = threading.Thread(target=make_room)
            clearer.start()
            handle = api.submit(config, settings=settings)
            clearer.join()
            with api.scheduling(handle) as scheduler:
                status = handle.wait(180, tick=scheduler.tick)
    finally:
        client.close()
        server.stop()
    assert status["state"] == "finished", status
    assert_same_weights(handle.final_weights(), reference_final_state(config))


PROCS = 2
# A worker's, whatever Redis answers: consumer, publisher, events, ledger, blobs, marks (10 after a run, here).
CONNECTIONS_PER_PROCESS = 16
WATCH_FULL_S = 30.0  # the workers meet the full Redis this long (before the fix: ten more clients a second each)


def connected_clients(client: redis.Redis) -> int:
    return int(client.info("clients")["connected_clients"])


def connections_to(port: int, launcher_process: subprocess.Popen[str]) -> dict[int, int]:
    """Open TCP connections to the broker's port of the launcher and each of its worker processes, by pid."""
    processes = [psutil.Process(launcher_process.pid), *worker_children(launcher_process)]
    return {
        process.pid: sum(
            1
            for connection in process.net_connections(kind="tcp")
            if connection.raddr and connection.raddr.port == port and connection.status == psutil.CONN_ESTABLISHED
        )
        for process in processes
    }


def test_workers_started_against_a_full_broker_keep_their_connections_bounded_and_go_on_once_room_is_made(
    settings: Settings, tmp_path: Path
) -> None:
    """Redis full before the workers start: each worker waits for room on the connections it has (no reconnect
    loop, no connection left open behind it), and once the junk is deleted a run ends with the reference weights."""
    server = EmbeddedRedis(extra_args=["--maxmemory", "32mb", "--maxmemory-policy", "noeviction"]).start()
    client = redis.Redis.from_url(server.url)
    settings = reliable_settings(replace(settings, broker_url=server.url))
    config = slow_config(0.0, rounds=2, devices_per_round=4, local_iters=3)
    log = (tmp_path / "launcher.log").open("w")
    workers = start_fedqueue_cli(
        "worker", "--procs", str(PROCS), cwd=tmp_path, env=cli_env(settings), stdout=log, stderr=subprocess.STDOUT
    )
    full_peak: dict[int, int] = {}

    def within_bound(peak: dict[int, int]) -> None:
        for pid, count in connections_to(server.port, workers).items():
            peak[pid] = max(peak.get(pid, 0), count)
            assert count <= CONNECTIONS_PER_PROCESS, f"process {pid}: {count} connections to Redis"

    try:
        junk = fill(client)
        before = oom_replies(client)
        # Each worker process has met the refusal (its consumer's first writes), then the count starts.
        wait_until(lambda: oom_replies(client) >= before + PROCS and len(worker_children(workers)) == PROCS, 120)
        began = time.monotonic()
        while time.monotonic() - began < WATCH_FULL_S:  # the fault's length: a look every half second
            within_bound(full_peak)
            time.sleep(0.5)
        clients_full = connected_clients(client) - 1  # less this test's own
        client.delete(*[f"junk:{index}" for index in range(junk)])
        wait_until(lambda: ping_count(settings) >= PROCS, 120)
        handle = api.submit(config, settings=settings)
        with api.scheduling(handle) as scheduler:
            status = handle.wait(180, tick=scheduler.tick)
        after: dict[int, int] = {}
        within_bound(after)
    finally:
        stop_launcher(workers)
        log.close()
        client.close()
        server.stop()
    print(f"Redis clients while full ({WATCH_FULL_S:.0f} s): {clients_full}; per process {full_peak}, after {after}")
    assert status["state"] == "finished", status
    assert_same_weights(handle.final_weights(), reference_final_state(config))
