"""Shared pieces of the benchmarks: the machine they ran on, Markdown tables, timers, process groups."""

from __future__ import annotations

import bisect
import os
import platform
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any, Self

BENCH_DIR = Path(__file__).resolve().parent
REPO = BENCH_DIR.parent


def machine() -> dict[str, Any]:
    """Cores, CPU model and GPUs of this machine: every result is recorded with it."""
    cpu = platform.processor() or "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    gpus = "none"
    smi = shutil.which("nvidia-smi")
    if smi:
        found = subprocess.run([smi, "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True)
        if found.returncode == 0 and found.stdout.strip():
            gpus = ", ".join(line.strip() for line in found.stdout.splitlines() if line.strip())
    import torch

    return {
        "cores": os.cpu_count() or 1,
        "cpu": cpu,
        "gpu": gpus,
        "torch": torch.__version__.split("+")[0],
        "python": platform.python_version(),
    }


def machine_line(info: dict[str, Any]) -> str:
    return (
        f"machine: {info['cores']} cores, {info['cpu']}, GPU: {info['gpu']}; "
        f"torch {info['torch']}, Python {info['python']}"
    )


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A Markdown table (first column left-aligned, the others right), ready to paste into RESULTS.md."""
    cells = [[str(cell) for cell in row] for row in rows]
    align = ["---"] + ["---:"] * (len(headers) - 1)
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join(align) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in cells]
    return "\n".join(lines)


def ratio(numerator: float | None, denominator: float | None) -> str:
    if not numerator or not denominator:
        return "–"
    return f"{numerator / denominator:.2f}x"


def verdict(ok: bool) -> str:
    return "met" if ok else "MISSED"


class Timers:
    """Wall time spent in chosen functions, by label; wraps them in place and restores them on exit."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.calls: Counter[str] = Counter()
        # While paused, calls still run but are not counted (work that belongs to another measure).
        self.paused = False
        self._restore: list[tuple[Any, str, Any]] = []

    def wrap(self, owner: Any, attribute: str, label: str) -> None:
        original = getattr(owner, attribute)

        def timed(*args: Any, **kwargs: Any) -> Any:
            if self.paused:
                return original(*args, **kwargs)
            began = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                self.seconds[label] += time.perf_counter() - began
                self.calls[label] += 1

        setattr(owner, attribute, timed)
        self._restore.append((owner, attribute, original))

    def restore(self) -> None:
        for owner, attribute, original in reversed(self._restore):
            setattr(owner, attribute, original)
        self._restore.clear()


@contextmanager
def celery_workers(
    app_path: str, names: Sequence[str], queue: str, env: dict[str, str], ready: Callable[[], int]
) -> Iterator[list[subprocess.Popen[bytes]]]:
    """`celery worker -P threads -c 1` processes, one per name, stopped (warm, then hard) on exit."""
    processes = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "celery",
                "-A",
                app_path,
                "worker",
                "--pool",
                "threads",
                "--concurrency",
                "1",
                "--hostname",
                f"{name}@%h",
                "--queues",
                queue,
                "--without-mingle",
                "--without-gossip",
                "--loglevel",
                "WARNING",
            ],
            env={**os.environ, **env},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        for name in names
    ]
    try:
        deadline = time.monotonic() + 120
        while ready() < len(names):
            if time.monotonic() > deadline or any(process.poll() is not None for process in processes):
                raise RuntimeError(f"{app_path} workers did not start")
        yield processes
    finally:
        for process in processes:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in processes:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def _machine_busy_s() -> float:
    """CPU seconds all cores have spent busy since boot (from /proc/stat)."""
    fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    ticks = [int(value) for value in fields]
    idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)  # idle + iowait
    return (sum(ticks[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def _own_cpu_s() -> float:
    """CPU seconds of this process and of its children that have been waited for."""
    times = os.times()
    return times.user + times.system + times.children_user + times.children_system


def tree_cpu_s(root: int | None = None) -> float:
    """CPU seconds of this process (or `root`) and of every live process below it (workers, an embedded Redis):
    the work a run cost, whatever else the machine was doing."""
    ticks = os.sysconf("SC_CLK_TCK")
    children: dict[int, list[int]] = {}
    used: dict[int, float] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # ended while read
            continue
        pid = int(entry.name)
        children.setdefault(int(fields[1]), []).append(pid)
        used[pid] = (int(fields[11]) + int(fields[12])) / ticks  # utime + stime
    total, waiting = 0.0, [os.getpid() if root is None else root]
    while waiting:
        pid = waiting.pop()
        total += used.get(pid, 0.0)
        waiting += children.get(pid, [])
    return total


class CpuSeries:
    """CPU seconds of the processes below this one (workers, an embedded Redis), read every `every_s` by a
    thread for a `with` block, so the CPU of any span inside it can be read afterwards (`between`)."""

    def __init__(self, every_s: float = 0.1) -> None:
        import threading

        self._every_s = every_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self.readings: list[tuple[float, float]] = []

    def _read(self) -> None:
        times = os.times()
        self.readings.append((time.time(), tree_cpu_s() - times.user - times.system))

    def _poll(self) -> None:
        while not self._stop.wait(self._every_s):
            self._read()

    def __enter__(self) -> Self:
        self._read()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._read()

    def at(self, when: float) -> float:
        """The CPU seconds used by `when`, read between the two readings around it."""
        stamps = [stamp for stamp, _ in self.readings]
        after = min(max(bisect.bisect_left(stamps, when), 1), len(stamps) - 1)
        (t0, c0), (t1, c1) = self.readings[after - 1], self.readings[after]
        return c0 + (c1 - c0) * (when - t0) / (t1 - t0) if t1 > t0 else c1

    def between(self, began: float, ended: float) -> float:
        return self.at(ended) - self.at(began)


def wait_for_quiet(threshold: float = 0.15, timeout_s: float = 180.0) -> None:
    """Wait until the machine is mostly idle: timings taken beside other work mean little."""
    cores = os.cpu_count() or 1
    deadline = time.monotonic() + timeout_s
    while True:
        before = _machine_busy_s()
        time.sleep(2.0)
        busy = (_machine_busy_s() - before) / (2.0 * cores)
        if busy < threshold:
            return
        if time.monotonic() > deadline:
            print(f"WARNING: the machine stayed {busy:.0%} busy with other work; timings are disturbed")
            return
        print(f"waiting for the machine to be quiet ({busy:.0%} busy with other work)", flush=True)


class ForeignLoad:
    """CPU used by work outside this benchmark (busy time of the machine minus our own processes')."""

    def __init__(self) -> None:
        self._began = time.monotonic()
        self._machine = _machine_busy_s()
        self._own = _own_cpu_s()
        self._detached_s = 0.0

    def add_own(self, cpu_s: float) -> None:
        """CPU the benchmark's own processes used outside its process tree (a cluster it started detached)."""
        self._detached_s += cpu_s

    def fraction(self) -> float:
        elapsed = time.monotonic() - self._began
        own = _own_cpu_s() - self._own + self._detached_s
        foreign = (_machine_busy_s() - self._machine) - own
        return max(0.0, foreign) / (elapsed * (os.cpu_count() or 1))

    def report(self) -> str:
        share = self.fraction()
        line = f"other work on the machine during the benchmark: {share:.1%} of its CPU time"
        return line + (" (WARNING: timings disturbed)" if share > 0.05 else "")


class PeakWatcher:
    """The peak of a reading (bytes), polled by a thread for a `with` block; `base_bytes` is the first reading."""

    def __init__(self, every_s: float) -> None:
        import threading

        self._every_s = every_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self.base_bytes = self._read()
        self.peak_bytes = self.base_bytes

    def _read(self) -> int:
        raise NotImplementedError

    def _poll(self) -> None:
        while not self._stop.wait(self._every_s):
            self.peak_bytes = max(self.peak_bytes, self._read())

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak_bytes = max(self.peak_bytes, self._read())


class RssWatcher(PeakWatcher):
    """Peak resident memory of some processes (the largest of them), polled every 20 ms; a process that ends
    keeps the peak it had."""

    def __init__(self, pids: Sequence[int], every_s: float = 0.02) -> None:
        import psutil

        self._processes = [psutil.Process(pid) for pid in pids]
        super().__init__(every_s)

    def _read(self) -> int:
        import psutil

        readings = [0]
        for process in self._processes:
            # A process that ended (a command that exits, a worker stopped) has no reading: its peak so far stands.
            with suppress(psutil.Error):
                readings.append(process.memory_info().rss)
        return max(readings)


def wait_run(handle: Any, cluster: Any, timeout_s: float = 1800.0) -> dict[str, Any]:
    """Wait for a run like RunHandle.wait, but fail at once if a worker process of the cluster exits."""
    deadline = time.monotonic() + timeout_s
    while handle.store.get_run(handle.id).state == "running":
        check_workers(cluster)
        if time.monotonic() > deadline:
            raise TimeoutError(f"run {handle.id} still running after {timeout_s:.0f} s")
        time.sleep(0.1)
    return handle.status()


def check_workers(cluster: Any) -> None:
    if any(process.poll() is not None for process in cluster.workers.processes):
        raise RuntimeError(f"a worker process exited during the benchmark (logs in {cluster.log_dir})")
