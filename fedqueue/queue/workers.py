"""Start worker processes: one per GPU (pinned with CUDA_VISIBLE_DEVICES), else one per core.

Each is a `celery worker` with the threads pool: it never forks, so CUDA is safe
in it, and it keeps answering pings and heartbeats while tasks run. This
launcher never imports torch.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import IO

from fedqueue.config import DEFAULT_GPUS_PER_WORKER, DEFAULT_PROCS_PER_GPU, Settings
from fedqueue.core import jobs
from fedqueue.core.process.gpus import visible_gpus
from fedqueue.errors import ConfigError, ServiceUnavailable
from fedqueue.queue.readiness import READY_KEY_ENV, forget, new_ready_key, wait_for_names
from fedqueue.queue.watchdog import TIMEOUT_EXIT_CODE

MAX_EARLY_EXITS = 5
EARLY_EXIT_S = 10.0
_PR_SET_PDEATHSIG = 1


def stop_when_parent_dies() -> None:
    """In a child before exec: ask Linux for SIGTERM (a warm stop) when the launcher dies."""
    if sys.platform.startswith("linux"):
        import ctypes

        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


@dataclass(frozen=True)
class WorkerSpec:
    name: str  # "gpu0" or "cpu0": the part of the hostname before '@'
    cuda_visible_devices: str  # GPU indices or GPU/MIG UUIDs, comma-separated; "" hides every GPU
    slots: int


def detect_gpus() -> list[str]:
    """GPU indices this host offers, found without touching CUDA in this process."""
    visible = visible_gpus()
    if visible is not None:
        return visible
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return []
    try:
        out = subprocess.run(
            [smi, "--query-gpu=index", "--format=csv,noheader"], capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [line.strip() for line in out.stdout.splitlines() if line.strip().isdigit()] if out.returncode == 0 else []


def plan_workers(
    gpus: list[str],
    procs: int | None,
    slots: int,
    gpus_per_worker: int = DEFAULT_GPUS_PER_WORKER,
    procs_per_gpu: int = DEFAULT_PROCS_PER_GPU,
) -> list[WorkerSpec]:
    """One worker per GPU, or per group of `gpus_per_worker` GPUs (a model too large for one), or per core.

    `procs_per_gpu` starts that many processes on each GPU, each with its own CUDA context
    (gpu0-0, gpu0-1, ...): models too small to fill a GPU from one process.
    """
    if slots < 1:
        raise ConfigError(f"--slots: must be at least 1, got {slots}")
    if procs is not None and procs < 1:
        raise ConfigError(f"--procs: must be at least 1, got {procs}")
    if gpus_per_worker < 1:
        raise ConfigError(f"--gpus-per-worker: must be at least 1, got {gpus_per_worker}")
    if gpus_per_worker > 1 and (not gpus or procs is not None):
        raise ConfigError("--gpus-per-worker: needs GPUs (none found here, or --procs asks for CPU workers)")
    if procs_per_gpu < 1:
        raise ConfigError(f"--procs-per-gpu: must be at least 1, got {procs_per_gpu}")
    if procs_per_gpu > 1 and (not gpus or procs is not None):
        raise ConfigError("--procs-per-gpu: needs GPUs (none found here, or --procs asks for CPU workers)")
    if procs_per_gpu > 1 and gpus_per_worker > 1:
        raise ConfigError("--procs-per-gpu: a worker spread over several GPUs (--gpus-per-worker) takes them whole")
    if gpus and len(gpus) % gpus_per_worker:
        raise ConfigError(f"--gpus-per-worker: {len(gpus)} GPUs do not split into groups of {gpus_per_worker}")
    if gpus and procs is None:
        groups = [gpus[start : start + gpus_per_worker] for start in range(0, len(gpus), gpus_per_worker)]
        return [
            WorkerSpec(
                name=_gpu_worker_name(group, position) + (f"-{process}" if procs_per_gpu > 1 else ""),
                cuda_visible_devices=",".join(group),
                slots=slots,
            )
            for position, group in enumerate(groups)
            for process in range(procs_per_gpu)
        ]
    count = procs if procs is not None else (os.cpu_count() or 1)
    return [WorkerSpec(name=f"cpu{index}", cuda_visible_devices="", slots=slots) for index in range(count)]


def named(specs: list[WorkerSpec], name: str | None) -> list[WorkerSpec]:
    """The plan with its one worker renamed (`--name gpu1`: a container that sees its GPU as GPU 0)."""
    if name is None:
        return specs
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}", name):
        raise ConfigError(f"--name: letters, digits, '.', '_' and '-' only (at most 64), got {name!r}")
    if len(specs) != 1:
        raise ConfigError(f"--name: names one worker process, but this host plans {len(specs)}")
    return [replace(specs[0], name=name)]


def beside(specs: list[WorkerSpec], running: Mapping[str, int]) -> list[WorkerSpec]:
    """The plan renamed where a name is taken by a running worker of this host (`running`: Celery hostnames),
    so that workers joining a cluster on the same host are told apart from its own."""
    host = socket.gethostname()
    return [
        replace(spec, name=f"{spec.name}-{os.getpid()}") if f"{spec.name}@{host}" in running else spec for spec in specs
    ]


def _gpu_worker_name(group: list[str], position: int) -> str:
    """gpu3 for GPU 3, gpu0-1 for GPUs 0 and 1; GPUs named by UUID (GPU-..., MIG-...) by the group's position."""
    if all(gpu.isdigit() for gpu in group):
        return f"gpu{group[0]}" if len(group) == 1 else f"gpu{group[0]}-{group[-1]}"
    return f"gpu{position}"


def worker_queues(settings: Settings) -> list[str]:
    """The control queue first (read first: see the app's queue order), then each served kind's queues."""
    suffixes = [jobs.CONTROL_QUEUE]
    for kind in jobs.select(settings.jobs):
        suffixes += [queue for queue in kind.queues if queue not in suffixes]
    return [settings.queue(suffix) for suffix in suffixes]


def worker_command(spec: WorkerSpec, settings: Settings, loglevel: str = "INFO") -> list[str]:
    return [
        sys.executable,
        "-m",
        "fedqueue.queue.worker_main",  # `celery`, then an exit without Python's teardown
        "-A",
        "fedqueue.queue.worker_app:app",
        "worker",
        "--pool",
        "threads",
        "--concurrency",
        str(spec.slots),
        "--hostname",
        f"{spec.name}@%h",
        "--queues",
        ",".join(worker_queues(settings)),
        "--task-events",
        "--without-mingle",
        "--without-gossip",
        "--loglevel",
        loglevel,
    ]


class WorkerGroup:
    """Worker processes started together and stopped together."""

    def __init__(self, settings: Settings, specs: list[WorkerSpec], log_dir: Path | None = None) -> None:
        self.settings = settings
        self.specs = specs
        self._log_dir = log_dir
        self._logs: list[IO[bytes]] = []
        self._started_at: dict[str, float] = {}
        self._early_exits: dict[str, int] = {}
        self.processes: list[subprocess.Popen[bytes]] = []
        self.ready_key = new_ready_key(settings)

    def start(self) -> WorkerGroup:
        self.processes = [self._spawn(spec) for spec in self.specs]
        return self

    def _spawn(self, spec: WorkerSpec) -> subprocess.Popen[bytes]:
        self._started_at[spec.name] = time.monotonic()
        env = {
            **os.environ,
            **self.settings.to_env(),
            # PCI order: the index nvidia-smi and NVML print is the one CUDA uses.
            "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
            "CUDA_VISIBLE_DEVICES": spec.cuda_visible_devices,
            READY_KEY_ENV: self.ready_key,
        }
        output: IO[bytes] | None = None
        if self._log_dir is not None:
            self._log_dir.mkdir(parents=True, exist_ok=True)
            output = open(self._log_dir / f"worker-{spec.name}.log", "ab")  # noqa: SIM115 - closed in stop()
            self._logs.append(output)
        # A session of its own: a Ctrl-C in the terminal reaches this launcher only, which
        # then decides between a warm and a cold stop. If the launcher dies, so does the worker.
        return subprocess.Popen(
            worker_command(spec, self.settings),
            env=env,
            stdout=output,
            stderr=output,
            start_new_session=True,
            preexec_fn=stop_when_parent_dies,
        )

    def restart_exited(self) -> list[str]:
        """Start again every worker that exited on its own (crashed or killed); returns their names.

        A worker that fails on its own again and again right after starting (MAX_EARLY_EXITS
        in a row, each with an error exit within EARLY_EXIT_S of its start) is given up on
        with ServiceUnavailable: it cannot start at all (a bad setting, a missing package),
        and restarting will not help. A worker killed by a signal is always started again.
        """
        restarted = []
        now = time.monotonic()
        for index, process in enumerate(self.processes):
            if process.poll() is None:
                continue
            spec = self.specs[index]
            crashed = process.returncode > 0 and process.returncode != TIMEOUT_EXIT_CODE
            early = crashed and now - self._started_at.get(spec.name, 0.0) < EARLY_EXIT_S
            self._early_exits[spec.name] = self._early_exits.get(spec.name, 0) + 1 if early else 0
            if self._early_exits[spec.name] >= MAX_EARLY_EXITS:
                raise ServiceUnavailable(
                    f"worker {spec.name} exited {MAX_EARLY_EXITS} times in a row right after starting{self._log_hint()}"
                )
            self.processes[index] = self._spawn(spec)
            restarted.append(f"{spec.name} (exit code {process.returncode})")
        return restarted

    def wait_ready(self, timeout_s: float = 120.0) -> None:
        """Block until every worker consumes and has warmed up (each says so on the broker)."""

        def check() -> None:
            if any(process.poll() is not None for process in self.processes):
                raise ServiceUnavailable(f"a worker exited during start-up{self._log_hint()}")

        names = {spec.name for spec in self.specs}
        missing = wait_for_names(self.settings, self.ready_key, names, time.monotonic() + timeout_s, check)
        if missing:
            raise ServiceUnavailable(f"workers did not answer within {timeout_s:.0f} s{self._log_hint()}")

    def slots(self) -> dict[str, int]:
        """The planned workers' slots by Celery hostname: known before any of them answers."""
        host = socket.gethostname()
        return {f"{spec.name}@{host}": spec.slots for spec in self.specs}

    def _log_hint(self) -> str:
        return f" (logs in {self._log_dir})" if self._log_dir else ""

    def signal_all(self, signum: int) -> None:
        for process in self.processes:
            if process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    process.send_signal(signum)

    def alive(self) -> bool:
        return any(process.poll() is None for process in self.processes)

    def stop(self, timeout_s: float = 60.0) -> None:
        """Warm stop (running tasks finish), then a cold one for whatever is still there."""
        self.signal_all(signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        for process in self.processes:
            try:
                process.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                break
        self.signal_all(signal.SIGKILL)
        for process in self.processes:
            process.wait()
        for log in self._logs:
            log.close()
        self._logs.clear()
        if self.settings.broker_url:
            forget(self.settings, self.ready_key)
