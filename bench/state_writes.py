"""What keeping a 45 MB state costs the store: a row through SQLite's WAL against a state file beside it.

    .venv/bin/python bench/state_writes.py [--mb 45] [--repeats 10]

In the same run, on two fresh SQLite stores made as fedqueue makes them (WAL, 64 KiB pages), one keeping states
in their rows (as Postgres does, and SQLite did before) and one in state files: the CPU and wall milliseconds a
call of (a) a sync round's checkpoint (`save_checkpoint`, replacing the last) and (b) a FedBuff fold pass that
makes a version (`save_pass`: the version kept, the checkpoint named, the version before last dropped).
Medians after two untimed calls; rows / files is the ratio.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import resource
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import machine, machine_line, markdown_table, ratio  # noqa: E402

from fedqueue.core.database import open_store  # noqa: E402
from fedqueue.fl.store import schedule_rows  # noqa: E402
from fedqueue.fl.store.results import save_checkpoint  # noqa: E402
from fedqueue.fl.store.schema import RoundRow  # noqa: E402
from fedqueue.store import Store  # noqa: E402

UNTIMED = 2


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _states(nbytes: int, count: int) -> list[tuple[str, bytes]]:
    """Distinct states (as a new model each round is), each with its sha256."""
    base = bytearray(os.urandom(nbytes))
    states = []
    for index in range(count):
        base[:8] = index.to_bytes(8, "big")
        data = bytes(base)
        states.append((hashlib.sha256(data).hexdigest(), data))
    return states


def _timed(calls: list[Callable[[], None]]) -> tuple[float, float]:
    """Median CPU and wall milliseconds of the calls after the untimed ones."""
    cpu, wall = [], []
    for index, call in enumerate(calls):
        began_cpu, began_wall = _cpu_s(), time.perf_counter()
        call()
        if index >= UNTIMED:
            cpu.append((_cpu_s() - began_cpu) * 1000)
            wall.append((time.perf_counter() - began_wall) * 1000)
    return statistics.median(cpu), statistics.median(wall)


def _run(store: Store, mode: str) -> str:
    run_id = uuid.uuid4().hex
    store.create_run(run_id, "bench", {"dataset": "digits", "mode": mode}, 1_000, kind="fl")
    return run_id


def checkpoints(store: Store, states: list[tuple[str, bytes]]) -> tuple[float, float]:
    run_id = _run(store, "fedavg")
    return _timed(
        [
            lambda index=index, sha=sha, data=data: save_checkpoint(store, run_id, index, sha, data)
            for index, (sha, data) in enumerate(states)
        ]
    )


def versions(store: Store, states: list[tuple[str, bytes]]) -> tuple[float, float]:
    run_id = _run(store, "fedbuff")
    assert schedule_rows.create_schedule(store, run_id, {}, 0)
    assert schedule_rows.claim_schedule(store, run_id, "bench", time.time() - 60) is not None

    def make(version: int, sha: str, data: bytes) -> None:
        next_round = RoundRow(
            run_id=run_id,
            round_index=version + 1,
            version=version,
            state="training",
            selected=[],
            model_key=f"{run_id}/model/{version}",
            model_sha256=sha,
            model_nbytes=len(data),
            enqueued_at=time.time(),
        )
        made = schedule_rows.MadeVersion(version, sha, data, {}, next_round)
        assert schedule_rows.save_pass(store, run_id, "bench", {}, version, [], {}, version - 1, [made])

    return _timed(
        [
            lambda version=version, sha=sha, data=data: make(version, sha, data)
            for version, (sha, data) in enumerate(states)
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mb", type=float, default=45.0, help="the state's size (ResNet-18's: 45 MB)")
    parser.add_argument("--repeats", type=int, default=10, help="timed calls of each")
    args = parser.parse_args()
    states = _states(int(args.mb * 1e6), args.repeats + UNTIMED)
    print(machine_line(machine()))
    rows = []
    with tempfile.TemporaryDirectory(prefix="fedqueue-bench-states-") as folder:
        results: dict[str, dict[str, tuple[float, float]]] = {}
        for keeping in ("rows", "files"):
            store = open_store(f"sqlite:///{Path(folder) / f'{keeping}.db'}", migrate=True)
            if keeping == "rows":
                store.state_files = None  # the rows keep the bytes, as before state files
            results[keeping] = {"checkpoint": checkpoints(store, states), "version": versions(store, states)}
            store.close()
        for call in ("checkpoint", "version"):
            (rows_cpu, rows_wall), (files_cpu, files_wall) = results["rows"][call], results["files"][call]
            rows.append(
                [
                    "(a) sync checkpoint" if call == "checkpoint" else "(b) FedBuff version",
                    f"{rows_cpu:.0f} / {rows_wall:.0f}",
                    f"{files_cpu:.0f} / {files_wall:.0f}",
                    ratio(rows_cpu, files_cpu),
                    ratio(rows_wall, files_wall),
                ]
            )
    print(f"a {args.mb:g} MB state, median of {args.repeats} calls, ms:")
    print(markdown_table(["call", "rows CPU / wall", "files CPU / wall", "rows / files CPU", "wall"], rows))


if __name__ == "__main__":
    main()
