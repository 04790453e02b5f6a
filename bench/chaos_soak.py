"""Chaos soak: FedBuff runs and LLM jobs side by side while workers and Redis are faulted at random.

A Redis of its own (a maxmemory limit, `noeviction`), a SQLite store, a `fedqueue worker` launcher
serving both job kinds, and two streams of work followed as users follow them: `fedqueue run CONFIG`
(FedBuff) and `fedqueue llm submit PROMPTS -o OUT`, one after another until the soak's time is up.
Meanwhile a seeded injector, at random intervals (exponential, `--faults-per-minute`), does one of:

    kill     SIGKILL a random worker process (the launcher starts it again)
    stop     SIGSTOP a random worker process for 2-10 s, then SIGCONT
    restart  stop Redis and start it again, empty, on its port
    fill     fill Redis with junk keys until it refuses a write (its maxmemory), hold 2-10 s, delete them
    forge    as any client of Redis could: a device task for a running FedBuff run that its scheduler never
             sent (its latest version's model, a device that version did not send out), or raw bytes that
             are no message at all; each must be dead-lettered once, never trained or folded

Two fills are not left to chance: Redis is full when the launcher starts its workers (held
`--fill-before-start-s`, then deleted), and a third of the way in it is filled mid-run and held
`--midrun-fill-s` (the 10 s that once left a run standing still for good). Redis's clients are counted
throughout: a worker that meets a full Redis must not open connection after connection.

At the end each FedBuff run is compared with the same experiment computed in this process with no
queue (the versions it made, from which updates, and the final weights bit for bit), and each LLM
job's stored and exported outputs with a one-prompt-at-a-time generate() loop. It prints the faults by
kind, the tasks redone (attempt > 1 in the store's task table), the updates and prompts lost (no
stored result, or not folded where the reference folds them) and counted twice (a duplicate row, or
an update folded more often than the reference folds it), the messages dead-lettered, and exits non-zero
if any is not 0, a result differs, a follower did not exit 0, or more messages were dead-lettered than forged.

    .venv/bin/python bench/chaos_soak.py [--minutes 10] [--seed 0] [--faults-per-minute 4]
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import redis
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import machine, machine_line, markdown_table  # noqa: E402
from fedqueue.config import Settings  # noqa: E402
from fedqueue.core.broker import keys  # noqa: E402
from fedqueue.core.database import open_store  # noqa: E402
from fedqueue.fl.config import RunConfig  # noqa: E402
from fedqueue.fl.kind import TRAIN_DEVICE  # noqa: E402
from fedqueue.fl.messages import DEVICES_QUEUE  # noqa: E402
from fedqueue.fl.store.results import device_tasks, list_rounds  # noqa: E402
from fedqueue.llm.results import prompt_rows  # noqa: E402
from fedqueue.llm.settings import GenerationSettings  # noqa: E402
from fedqueue.llm.tiny import build_bench_llama, build_tiny_llama  # noqa: E402
from fedqueue.queue.app import make_app  # noqa: E402
from fedqueue.queue.embedded import EmbeddedRedis  # noqa: E402
from fedqueue.store import Store  # noqa: E402
from tests.fl.strategy.fedbuff.test_buffered_async import BUFFERED, reference, sorted_reference, versions_made  # noqa: E402
from tests.llm.test_llm_queue import expected_outputs  # noqa: E402
from tests.support.cli_inputs import cli_env  # noqa: E402
from tests.support.cli_runner import start_fedqueue_cli  # noqa: E402
from tests.support.helpers import small_config  # noqa: E402
from tests.support.reliability_support import kill_tree, ping_count, stop_launcher, wait_until  # noqa: E402

FAULT_KINDS = ("kill", "stop", "restart", "fill", "forge")
JUNK_PREFIX = "chaos-junk:"  # junk keys of the fill fault; fedqueue's keys start with its key prefix
SUBMIT_TRIES = 5
DEAD_LETTERED = "dead-lettered a message from"  # a worker's log line for each message refused for good
ID_LINE = re.compile(r"\b(?:run|job) ([0-9A-Za-z_.-]+) (?:submitted|continued)")


# --- the broker ---------------------------------------------------------------------------------------------


class Broker:
    """An EmbeddedRedis on a fixed port with a maxmemory limit and noeviction, started again empty on demand."""

    def __init__(self, maxmemory_mb: int) -> None:
        self.maxmemory = maxmemory_mb * 2**20
        self.server = self._start(None)
        self.port = self.server.port
        self.url = self.server.url
        self.lock = threading.Lock()

    def _start(self, port: int | None) -> EmbeddedRedis:
        limit = ["--maxmemory", str(self.maxmemory), "--maxmemory-policy", "noeviction"]
        if "extra_args" in inspect.signature(EmbeddedRedis).parameters:
            server = EmbeddedRedis(port=port, extra_args=limit).start()
        else:  # an EmbeddedRedis that takes no server options: the same limits set once it answers
            server = EmbeddedRedis(port=port).start()
            client = redis.Redis.from_url(server.url)
            client.config_set("maxmemory", self.maxmemory)
            client.config_set("maxmemory-policy", "noeviction")
            client.close()
        return server

    def restart(self, down_s: float) -> None:
        """Stop Redis (all it held is gone), wait, start it again on its port."""
        with self.lock:
            self.server.stop()
            time.sleep(down_s)
            deadline = time.monotonic() + 60
            while True:
                try:
                    self.server = self._start(self.port)
                    return
                except Exception:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.5)

    def client(self) -> redis.Redis:
        return redis.Redis.from_url(self.url, socket_connect_timeout=2, socket_timeout=10)

    def used_mb(self) -> float:
        client = self.client()
        try:
            return int(client.info("memory")["used_memory"]) / 2**20
        finally:
            client.close()

    def stop(self) -> None:
        self.server.stop()


@dataclass
class Junk:
    keys: list[str]  # written before Redis refused a write
    refused: bool  # Redis refused a write: it is truly full
    written_mb: float
    used_mb: float  # what Redis used then


def fill(broker: Broker) -> Junk:
    """Junk keys until Redis refuses a write (1 MiB values, then 64 KiB ones to its very limit)."""
    client = broker.client()
    keys: list[str] = []
    refused = False
    try:
        first = 0
        for size in (2**20, 2**16):
            first = first or len(keys)
            value = os.urandom(size)
            while len(keys) < 100_000:
                key = f"{JUNK_PREFIX}{len(keys)}"
                try:
                    client.set(key, value)
                except redis.ResponseError as err:  # noeviction's refusal: OutOfMemoryError
                    if "maxmemory" not in str(err):
                        raise
                    refused = True
                    break
                keys.append(key)
        written = sum(2**20 if i < first else 2**16 for i in range(len(keys))) / 2**20
        used = int(client.info("memory")["used_memory"]) / 2**20
    except BaseException:
        empty(broker, keys)
        raise
    finally:
        client.close()
    return Junk(keys, refused, written, used)


def empty(broker: Broker, keys: list[str]) -> None:
    """The junk deleted (a broker restarted meanwhile holds none of it)."""
    client = broker.client()
    with contextlib.suppress(redis.RedisError):
        for start in range(0, len(keys), 500):
            client.delete(*keys[start : start + 500])
    client.close()


def redis_clients(broker: Broker) -> int:
    """Redis's connected clients now (0 when it does not answer)."""
    try:
        client = broker.client()
        try:
            return int(client.info("clients")["connected_clients"])
        finally:
            client.close()
    except redis.RedisError:
        return 0


# --- the fault injector -------------------------------------------------------------------------------------


@dataclass
class Faults:
    counts: Counter[str] = field(default_factory=Counter)
    events: list[str] = field(default_factory=list)  # one line per fault, with its time into the soak
    failed: list[str] = field(default_factory=list)  # faults the injector itself could not complete
    junk_mb: list[float] = field(default_factory=list)  # MiB of junk written by each fill before Redis refused
    oom_refusals: int = 0  # fill faults that ended with Redis refusing a write (Redis truly full)
    peak_clients: int = 0  # Redis's connected clients, at most, sampled every second (this script's included)
    forged: int = 0  # messages the forge fault put on the queue (each must be dead-lettered once)


class Injector(threading.Thread):
    """At random intervals, one fault of a random kind; `stop_event` ends it after the fault in progress."""

    def __init__(
        self,
        seed: int,
        per_minute: float,
        kinds: tuple[str, ...],
        launcher: subprocess.Popen[str],
        broker: Broker,
        began: float,
        settings: Settings,
        midrun_fill: tuple[float, float] | None = None,
    ) -> None:
        super().__init__(daemon=True)
        self.settings = settings  # the store the forge fault reads, the queue it writes
        self.midrun_fill = midrun_fill  # (seconds into the soak, held): one fill at that time, whatever the draw
        self.rng = random.Random(seed)
        self.per_minute = per_minute
        self.kinds = kinds
        self.launcher = launcher
        self.broker = broker
        self.began = began
        self.stop_event = threading.Event()
        self.faults = Faults()
        self.stopped: set[int] = set()  # pids under SIGSTOP, continued whatever happens

    def run(self) -> None:
        while not self.stop_event.wait(self.rng.expovariate(self.per_minute / 60.0)):
            kind = self.rng.choice(self.kinds)
            due = self.midrun_fill is not None and time.monotonic() - self.began >= self.midrun_fill[0]
            if due and self.midrun_fill is not None:
                kind, hold = "fill-mid", self.midrun_fill[1]
                self.midrun_fill = None
            try:
                detail = self._fill(hold) if kind == "fill-mid" else getattr(self, f"_{kind}")()
            except Exception as err:  # the soak goes on; the injector's own failure is reported
                self.faults.failed.append(f"{kind}: {type(err).__name__}: {err}")
                continue
            if detail is not None:
                self.faults.counts[kind] += 1
                self.faults.events.append(f"{time.monotonic() - self.began:7.1f} s  {kind:8s} {detail}")

    def _forge(self) -> str | None:
        queue = self.settings.queue(DEVICES_QUEUE)
        if self.rng.random() < 0.5:
            client = self.broker.client()
            try:
                client.rpush(keys.queue_list(self.settings.key_prefix, queue), os.urandom(self.rng.randint(1, 64)))
            finally:
                client.close()
            self.faults.forged += 1
            return "raw bytes that are no message"
        store = open_store(self.settings.database_url)
        try:
            running = [run for run in store.list_runs() if run.state == "running" and run.kind == "fl"]
            rows = list_rounds(store, running[-1].id) if running else []
        finally:
            store.close()
        if not rows:
            return None
        row = rows[-1]
        config = RunConfig.from_dict(running[-1].config)
        unsent = min(set(range(config.num_devices)) - set(row.selected))
        task = {
            "run_id": row.run_id,
            "round_index": row.round_index,
            "devices": [unsent],
            "model": {"key": row.model_key, "sha256": row.model_sha256, "nbytes": row.model_nbytes},
            "enqueued_at": time.time(),
            "round_size": 1,
            "mode": "sequential",
        }
        app = make_app(self.settings)
        try:
            app.send_task(TRAIN_DEVICE, args=[task], queue=queue)
        finally:
            app.close()
        self.faults.forged += 1
        return f"run {row.run_id} version {row.round_index}: device {unsent}, never sent"

    def _workers(self) -> list[psutil.Process]:
        try:
            return [child for child in psutil.Process(self.launcher.pid).children() if child.is_running()]
        except psutil.NoSuchProcess:
            return []

    def _kill(self) -> str | None:
        workers = self._workers()
        if not workers:
            return None
        victim = self.rng.choice(workers)
        try:
            os.kill(victim.pid, signal.SIGKILL)
        except ProcessLookupError:
            return None
        return f"pid {victim.pid}"

    def _stop(self) -> str | None:
        workers = self._workers()
        if not workers:
            return None
        victim = self.rng.choice(workers)
        frozen_s = self.rng.uniform(2.0, 10.0)
        try:
            os.kill(victim.pid, signal.SIGSTOP)
        except ProcessLookupError:
            return None
        self.stopped.add(victim.pid)
        try:
            time.sleep(frozen_s)
        finally:
            self.cont(victim.pid)
        return f"pid {victim.pid} for {frozen_s:.1f} s"

    def cont(self, pid: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)
        self.stopped.discard(pid)

    def _restart(self) -> str:
        down_s = self.rng.uniform(0.5, 3.0)
        self.broker.restart(down_s)
        return f"down {down_s:.1f} s, back empty on port {self.broker.port}"

    def _fill(self, hold_s: float | None = None) -> str:
        """Junk keys until Redis refuses a write, held (2-10 s unless told), deleted."""
        hold_s = self.rng.uniform(2.0, 10.0) if hold_s is None else hold_s
        junk = fill(self.broker)
        try:
            time.sleep(hold_s)
        finally:
            empty(self.broker, junk.keys)
        self.faults.oom_refusals += junk.refused
        self.faults.junk_mb.append(junk.written_mb)
        return (
            f"{len(junk.keys)} junk keys, Redis at {junk.used_mb:.1f} MiB (refused a write: {junk.refused}),"
            f" held {hold_s:.1f} s"
        )

    def finish(self) -> None:
        """Stop injecting (the fault in progress ends first) and continue any worker still stopped."""
        self.stop_event.set()
        self.join(timeout=120)
        for pid in list(self.stopped):
            self.cont(pid)


# --- the two streams of work --------------------------------------------------------------------------------


@dataclass
class Followed:
    """One run or job, followed by its command."""

    kind: str  # fedbuff | llm
    index: int
    run_id: str | None = None
    rc: int | None = None
    wall_s: float = 0.0
    traceback: bool = False
    output_tail: str = ""
    state: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    # Submissions that printed no id: (the error they ended with, whether they printed a traceback).
    refused: list[tuple[str, bool]] = field(default_factory=list)


def fedbuff_config(index: int, seed: int, versions: int) -> RunConfig:
    """The buffered-async config of the FedBuff tests, a seed per run, `versions` versions."""
    return small_config(**{**BUFFERED, "num_devices": 40, "max_model_version": versions, "seed": seed + index})


def toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(toml_value(item) for item in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{key} = {toml_value(item)}" for key, item in value.items()) + " }"
    raise TypeError(f"no TOML for {value!r}")


def write_toml(config: RunConfig, path: Path) -> Path:
    items = {key: value for key, value in config.to_dict().items() if value is not None and value != {}}
    path.write_text("".join(f"{key} = {toml_value(value)}\n" for key, value in items.items()))
    return path


def llm_prompts(index: int, count: int) -> list[dict[str, Any]]:
    """Prompts of one job, none shared with another job (each job generates all of its own)."""
    return [{"id": f"j{index}-p{i}", "prompt": f"Job {index}, item {i}: " + "go " * (i % 7)} for i in range(count)]


def follow(
    command: list[str], env: dict[str, str], workdir: Path, name: str, store: Store, record: Followed, wait_s: float
) -> None:
    """Run a follower to its end, as a user would: a submission refused before it printed an id is tried again
    (up to SUBMIT_TRIES times, 5 s apart); a follower that printed its id but did not end well leaves its run to
    the launcher's adopter, which is waited for in the store."""
    for attempt in range(1, SUBMIT_TRIES + 1):
        log = workdir / f"{name}-{attempt}.log"
        began = time.monotonic()
        with log.open("w") as out:
            process = start_fedqueue_cli(*command, cwd=workdir, env=env, stdout=out, stderr=subprocess.STDOUT)
        try:
            process.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            kill_tree(process.pid)
            process.wait()
        record.wall_s += time.monotonic() - began
        record.rc = process.returncode
        output = log.read_text()
        record.output_tail = output[-3000:]
        record.traceback = "Traceback" in output
        found = ID_LINE.search(output)
        record.run_id = found.group(1) if found else None
        if record.run_id is not None or record.rc == 0:
            break
        record.refused.append((_last_line(output), "Traceback" in output))
        time.sleep(5.0)
    if record.run_id is None:
        return
    if record.rc != 0:  # an orphaned run goes on under the launcher's adopter: wait for it to end
        with contextlib.suppress(AssertionError):
            wait_until(lambda: store.get_run(record.run_id or "").state != "running", 600)
    record.state = store.get_run(record.run_id).state


def _last_line(output: str) -> str:
    """The error a command ended with: its last non-blank line."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    return lines[-1][:300] if lines else "(no output)"


def fedbuff_stream(
    args: argparse.Namespace, env: dict[str, str], workdir: Path, store: Store, deadline: float, out: list[Followed]
) -> None:
    index = 0
    while time.monotonic() < deadline:
        config = fedbuff_config(index, args.seed, args.versions)
        path = write_toml(config, workdir / f"fedbuff-{index}.toml")
        record = Followed("fedbuff", index, extra={"config": config})
        out.append(record)
        follow(["run", str(path)], env, workdir, f"fedbuff-{index}", store, record, args.follower_timeout_s)
        index += 1


def llm_stream(
    args: argparse.Namespace,
    env: dict[str, str],
    workdir: Path,
    store: Store,
    deadline: float,
    model: Path,
    out: list[Followed],
) -> None:
    index = 0
    while time.monotonic() < deadline:
        prompts = workdir / f"llm-{index}.jsonl"
        prompts.write_text("".join(json.dumps(p) + "\n" for p in llm_prompts(index, args.prompts)))
        exported = workdir / f"llm-{index}.out.jsonl"
        command = ["llm", "submit", str(prompts), "--model", str(model), "--batch-size", str(args.batch_size)]
        command += ["--max-new-tokens", str(args.max_new_tokens), "-o", str(exported)]
        record = Followed("llm", index, extra={"exported": exported, "prompts": args.prompts})
        out.append(record)
        follow(command, env, workdir, f"llm-{index}", store, record, args.follower_timeout_s)
        index += 1


# --- the checks ---------------------------------------------------------------------------------------------


@dataclass
class Verdict:
    lost: int = 0
    twice: int = 0
    redone: int = 0
    tasks: int = 0
    differ: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def redone_tasks(store: Store, run_id: str) -> tuple[int, int, Counter[str]]:
    """Tasks stored, tasks stored by a delivery after the first (attempt > 1), and those by type."""
    timings = store.task_timings(run_id)
    redone = Counter(row.task_type for row in timings if row.attempt > 1)
    return len(timings), sum(redone.values()), redone


def check_fedbuff(store: Store, database_url: str, record: Followed, verdict: Verdict) -> None:
    config: RunConfig = record.extra["config"]
    name = f"{record.kind} {record.index} ({record.run_id})"
    if record.run_id is None:
        verdict.differ.append(f"{name}: no run id printed")
        return
    expected = sorted_reference(config)
    want = Counter((r, d) for _, updates in expected for r, d, _ in updates)
    made = versions_made(store, record.run_id)
    got = Counter((r, d) for _, updates in made for r, d, _ in updates)
    lost = sum((want - got).values())
    rows = device_tasks(store, record.run_id)
    duplicate_rows = len(rows) - len({(row.round_index, row.device) for row in rows})
    twice = sum((got - want).values()) + duplicate_rows
    final = _final_weights(database_url, record.run_id)
    weights = reference(config)[1]
    same = (
        final is not None and final.keys() == weights.keys() and all(torch.equal(final[k], weights[k]) for k in final)
    )
    tasks, redone, by_type = redone_tasks(store, record.run_id)
    verdict.lost += lost
    verdict.twice += twice
    verdict.redone += redone
    verdict.tasks += tasks
    record.extra.update(lost=lost, twice=twice, same=same, redone=dict(by_type), versions_same=made == expected)
    if record.state != "finished" or not same or made != expected:
        verdict.differ.append(
            f"{name}: state {record.state}, versions as the reference's: {made == expected}, weights equal: {same}"
        )


def _final_weights(database_url: str, run_id: str) -> dict[str, torch.Tensor] | None:
    from fedqueue.fl import api

    try:
        return api.RunHandle(run_id, Settings(database_url=database_url)).final_weights()
    except Exception as err:  # a run that ended without its final weights
        print(f"run {run_id}: no final weights ({type(err).__name__}: {err})")
        return None


def check_llm(store: Store, record: Followed, model: Path, generation: GenerationSettings, verdict: Verdict) -> None:
    name = f"{record.kind} {record.index} ({record.run_id})"
    if record.run_id is None:
        verdict.differ.append(f"{name}: no job id printed")
        return
    rows = prompt_rows(store, record.run_id)
    inputs = {p["id"] for p in llm_prompts(record.index, record.extra["prompts"])}
    done = [row for row in rows if row.state == "done"]
    lost = len(inputs - {row.input_id for row in done})
    twice = len(rows) - len({row.key for row in rows})
    expected = expected_outputs(model, done, generation)
    stored = {row.key: row.output for row in done}
    same = stored == expected and {row.input_id for row in rows} == inputs
    exported_path: Path = record.extra["exported"]
    exported_same = False
    if exported_path.exists():
        exported = [json.loads(line) for line in exported_path.read_text().splitlines()]
        exported_same = {row["id"]: row["output"] for row in exported} == {row.input_id: row.output for row in done}
    tasks, redone, by_type = redone_tasks(store, record.run_id)
    verdict.lost += lost
    verdict.twice += twice
    verdict.redone += redone
    verdict.tasks += tasks
    record.extra.update(lost=lost, twice=twice, same=same, exported_same=exported_same, redone=dict(by_type))
    # A follower that died writes no -o file: that is counted with the followers, not as a differing result.
    if record.state != "finished" or not same or (record.rc == 0 and not exported_same):
        verdict.differ.append(
            f"{name}: state {record.state}, outputs as the loop's: {same}, exported file complete and equal: "
            f"{exported_same}"
        )


# --- the soak -----------------------------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0, help="how long new runs and jobs are started")
    parser.add_argument("--seed", type=int, default=0, help="the injector's seed (and the FedBuff runs')")
    parser.add_argument("--faults-per-minute", type=float, default=4.0, help="mean rate of faults")
    parser.add_argument("--kinds", default=",".join(FAULT_KINDS), help="faults to inject, of " + ",".join(FAULT_KINDS))
    parser.add_argument("--procs", type=int, default=2, help="worker processes under the launcher")
    parser.add_argument("--maxmemory-mb", type=int, default=64, help="Redis's maxmemory (noeviction)")
    parser.add_argument("--fill-before-start-s", type=float, default=10.0, help="Redis held full as workers start")
    parser.add_argument("--midrun-fill-s", type=float, default=10.0, help="the fill a third in is held (0: none)")
    parser.add_argument("--versions", type=int, default=30, help="model versions of each FedBuff run")
    parser.add_argument("--prompts", type=int, default=32, help="prompts of each LLM job")
    parser.add_argument("--batch-size", type=int, default=2, help="prompts per LLM batch")
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument("--model", choices=("bench", "tiny"), default="bench", help="the ~25M or the tiny Llama")
    parser.add_argument("--max-attempts", type=int, default=None, help="FEDQUEUE_MAX_ATTEMPTS (default: fedqueue's)")
    parser.add_argument("--follower-timeout-s", type=float, default=1800.0)
    parser.add_argument("--keep", action="store_true", help="keep the work folder (logs, store)")
    args = parser.parse_args()
    kinds = tuple(kind for kind in args.kinds.split(",") if kind)
    if not kinds or set(kinds) - set(FAULT_KINDS):
        parser.error(f"--kinds: of {','.join(FAULT_KINDS)}")

    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()  # the reference loop loads the model once per job
    info = machine()
    print(machine_line(info), flush=True)
    workdir = Path(tempfile.mkdtemp(prefix="fedqueue-chaos-"))
    print(f"work folder: {workdir}", flush=True)
    build = build_bench_llama if args.model == "bench" else build_tiny_llama
    model = build(workdir / f"{args.model}-llama")
    generation = GenerationSettings(max_new_tokens=args.max_new_tokens)

    broker = Broker(args.maxmemory_mb)
    changes: dict[str, Any] = {"heartbeat_ttl_s": 3, "lease_ttl_s": 5}
    if args.max_attempts is not None:
        changes["max_attempts"] = args.max_attempts
    settings = Settings(broker_url=broker.url, database_url=f"sqlite:///{workdir / 'soak.db'}", **changes)
    env = cli_env(settings)
    store = open_store(settings.database_url, migrate=True)
    launcher_log = (workdir / "launcher.log").open("w")
    junk = fill(broker)  # Redis full when the workers start, until the hold below ends
    launcher = start_fedqueue_cli(
        "worker", "--procs", str(args.procs), cwd=workdir, env=env, stdout=launcher_log, stderr=subprocess.STDOUT
    )
    records: list[Followed] = []
    injector: Injector | None = None
    began = time.monotonic()
    start_clients = 0
    try:
        held_until = time.monotonic() + args.fill_before_start_s
        try:
            while time.monotonic() < held_until:  # the fault's length, Redis's clients counted meanwhile
                start_clients = max(start_clients, redis_clients(broker))
                time.sleep(0.5)
        finally:
            empty(broker, junk.keys)
        print(
            f"fill before start: {len(junk.keys)} junk keys (refused a write: {junk.refused}), held "
            f"{args.fill_before_start_s:g} s while {args.procs} workers started: Redis clients at most {start_clients}",
            flush=True,
        )
        wait_until(lambda: ping_count(settings) >= args.procs, 120)
        began = time.monotonic()
        deadline = began + args.minutes * 60
        midrun = (args.minutes * 60 / 3, args.midrun_fill_s) if args.midrun_fill_s > 0 else None
        injector = Injector(args.seed, args.faults_per_minute, kinds, launcher, broker, began, settings, midrun)
        injector.faults.peak_clients = start_clients
        fl_records: list[Followed] = []
        llm_records: list[Followed] = []
        streams = [
            threading.Thread(target=fedbuff_stream, args=(args, env, workdir, store, deadline, fl_records)),
            threading.Thread(target=llm_stream, args=(args, env, workdir, store, deadline, model, llm_records)),
        ]
        for stream in streams:
            stream.start()
        injector.start()
        _progress(streams, fl_records, llm_records, injector, began)
        records = fl_records + llm_records
        injector.finish()
        orphans = wait_for_orphans(store, {r.run_id for r in records}, 300)
    finally:
        if injector is not None:
            injector.finish()
        stop_launcher(launcher)
        launcher_log.close()
        broker.stop()
    wall = time.monotonic() - began
    assert injector is not None

    verdict = Verdict()
    for record in records:
        if record.kind == "fedbuff":
            check_fedbuff(store, settings.database_url, record, verdict)
        else:
            check_llm(store, record, model, generation, verdict)
    for orphan in orphans:
        check_orphan(store, settings.database_url, orphan, verdict)
    workers_log = (workdir / "launcher.log").read_text()
    crashes = workers_log.count("Unrecoverable error")
    dead = workers_log.count(DEAD_LETTERED)
    return report(args, info, wall, records, orphans, injector.faults, verdict, crashes, dead, workdir)


def wait_for_orphans(store: Store, named: set[str | None], timeout_s: float) -> list[Followed]:
    """Runs and jobs in the store that no follower named (a submission that failed after it wrote its run):
    the launcher adopts running ones; wait for them to end."""
    deadline = time.monotonic() + timeout_s
    while True:
        orphans = [run for run in store.list_runs() if run.id not in named]
        if all(run.state != "running" for run in orphans) or time.monotonic() > deadline:
            break
        time.sleep(2.0)
    return [
        Followed("orphan " + run.kind, index, run_id=run.id, state=run.state, extra={"config": run.config})
        for index, run in enumerate(orphans)
    ]


def check_orphan(store: Store, database_url: str, orphan: Followed, verdict: Verdict) -> None:
    """A finished FL orphan must still equal its reference; one left running or failed is reported as such."""
    if orphan.kind == "orphan fl" and orphan.state == "finished":
        orphan.extra["config"] = RunConfig.from_dict(orphan.extra["config"])
        check_fedbuff(store, database_url, orphan, verdict)
    elif orphan.state != "finished":
        verdict.differ.append(f"{orphan.kind} {orphan.run_id}: left {orphan.state} (its submission failed)")


def _progress(
    streams: list[threading.Thread],
    fl_records: list[Followed],
    llm_records: list[Followed],
    injector: Injector,
    began: float,
) -> None:
    """Wait for both streams, printing a line a minute."""
    next_line = time.monotonic() + 60
    while any(stream.is_alive() for stream in streams):
        time.sleep(1.0)
        injector.faults.peak_clients = max(injector.faults.peak_clients, redis_clients(injector.broker))
        if time.monotonic() >= next_line:
            next_line += 60
            ended = [r for r in fl_records + llm_records if r.rc is not None]
            print(
                f"{time.monotonic() - began:5.0f} s: FedBuff runs {len(fl_records)}, LLM jobs {len(llm_records)} "
                f"({len(ended)} ended); faults {dict(injector.faults.counts)}",
                flush=True,
            )


def report(
    args: argparse.Namespace,
    info: dict[str, Any],
    wall: float,
    records: list[Followed],
    orphans: list[Followed],
    faults: Faults,
    verdict: Verdict,
    crashes: int,
    dead: int,
    workdir: Path,
) -> int:
    print()
    print("faults injected:")
    for line in faults.events:
        print("  " + line)
    for line in faults.failed:
        print("  injector could not complete: " + line)
    print()
    rows = []
    for record in records + orphans:
        extra = record.extra
        rows.append(
            [
                f"{record.kind} {record.index}",
                record.run_id,
                record.state,
                "–" if record.rc is None else record.rc,
                len(record.refused),
                f"{record.wall_s:.0f}",
                sum(extra.get("redone", {}).values()),
                extra.get("lost", "–"),
                extra.get("twice", "–"),
                extra.get("same", "–"),
            ]
        )
    headers = ["run/job", "id", "state", "exit", "refused", "wall s", "redone", "lost", "twice", "equal"]
    print(markdown_table(headers, rows))
    print()
    fl = [r for r in records if r.kind == "fedbuff"]
    llm = [r for r in records if r.kind == "llm"]
    followers_bad = [r for r in records if r.rc != 0 or r.traceback]
    refused = [(r, line, traceback) for r in records for line, traceback in r.refused]
    total = sum(faults.counts.values())
    by_kind = ", ".join(f"{kind} {faults.counts.get(kind, 0)}" for kind in (*FAULT_KINDS, "fill-mid"))
    print(machine_line(info) + "; CPU only")
    print(
        f"soak: {wall / 60:.1f} min (new work started for {args.minutes:g} min), seed {args.seed}, "
        f"{args.faults_per_minute:g} faults/min, {args.procs} worker processes, Redis maxmemory {args.maxmemory_mb} MiB"
    )
    print(f"work: {len(fl)} FedBuff runs ({args.versions} versions each), {len(llm)} LLM jobs ({args.prompts} prompts)")
    print(f"faults injected: {total} ({by_kind})")
    if faults.junk_mb:
        print(f"fills: Redis refused a write (full) in {faults.oom_refusals} of {len(faults.junk_mb)}")
    print(f"Redis clients at most (this script's included): {faults.peak_clients}")
    print(f"worker crashes ('Unrecoverable error' in the launcher's log): {crashes}")
    print(f"forged tasks and raw bytes put on the device queue: {faults.forged} (a forged result would differ below)")
    # Fewer where a Redis restart emptied the queue before a worker took them; more would be one refused twice.
    print(f"messages dead-lettered (the workers' log): {dead}")
    print(f"tasks stored: {verdict.tasks}; tasks redone (attempt > 1): {verdict.redone}")
    print(f"lost: {verdict.lost}")
    print(f"counted twice: {verdict.twice}")
    print(
        f"submissions refused before an id was printed (each tried again): {len(refused)}, "
        f"with a traceback: {sum(traceback for _, _, traceback in refused)}"
    )
    for record, line, traceback in refused:
        print(f"  {record.kind} {record.index}: {line}" + (" (after a traceback)" if traceback else ""))
    print(f"runs and jobs in the store that no follower named (written by a refused submission): {len(orphans)}")
    print(f"followers that did not exit 0 or printed a traceback: {len(followers_bad)}")
    for record in followers_bad:
        print(f"  {record.kind} {record.index} ({record.run_id}) exit {record.rc}: {_last_line(record.output_tail)}")
    print(
        f"results equal to the unfaulted reference: {not verdict.differ} ({len(records) + len(orphans)} runs and jobs)"
    )
    for line in verdict.differ:
        print("  DIFFERS: " + line)
    # A submission refused with one line while the broker is down is what a user can act on (it is tried again);
    # one that ends in a traceback is not.
    crashed = [line for _, line, traceback in refused if traceback]
    twice_dead = dead > faults.forged
    ok = bool(records) and not (
        verdict.differ or verdict.lost or verdict.twice or followers_bad or crashed or twice_dead
    )
    print("PASS" if ok else "FAIL")
    if not args.keep and ok:
        import shutil

        shutil.rmtree(workdir, ignore_errors=True)
    else:
        print(f"logs and store kept in {workdir}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
