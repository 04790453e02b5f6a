"""A local cluster that outlives one command: `fedqueue up --detach` starts it, `fedqueue down` stops it."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

from fedqueue.config import Settings
from fedqueue.core.broker.shm import remove_cluster_files
from fedqueue.errors import FedqueueError, ServiceUnavailable
from fedqueue.queue import cluster_file
from fedqueue.queue.local import prepare_log_dir

READY_WORD = b"ready"
DOWN_TIMEOUT_S = 90.0


def start_detached(up_args: list[str], log_dir: Path) -> tuple[int, str]:
    """Start `fedqueue up` in a session of its own, its output and its workers' logs in `log_dir`; its pid and
    broker URL once its workers are ready.

    The child says "ready URL" on a pipe; the pipe closing without it means the child failed.
    """
    prepare_log_dir(log_dir)
    read_end, write_end = os.pipe()
    with open(log_dir / "up.log", "ab") as log:
        child = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "fedqueue.cli",
                "up",
                *up_args,
                "--log-dir",
                str(log_dir),
                "--ready-fd",
                str(write_end),
            ],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            pass_fds=[write_end],
            start_new_session=True,  # a Ctrl-C or a closed terminal here does not reach it
        )
    os.close(write_end)
    with os.fdopen(read_end, "rb") as ready:
        said = ready.readline(64 * 1024)  # blocks until the child is ready, or gone
    word, _, broker_url = said.rstrip(b"\n").partition(b" ")
    if word != READY_WORD or not said.endswith(b"\n"):
        child.wait()
        tail = (log_dir / "up.log").read_text(errors="replace").strip().splitlines()[-1:] or ["no output"]
        raise ServiceUnavailable(f"fedqueue up did not start: {tail[0]} (log in {log_dir / 'up.log'})")
    return child.pid, broker_url.decode()


def say_ready(fd: int | None, broker_url: str) -> None:
    """Tell a detaching parent that the cluster is ready, and its broker (and let it go)."""
    if fd is None:
        return
    try:
        os.write(fd, READY_WORD + b" " + broker_url.encode() + b"\n")
    finally:
        os.close(fd)
    # Nobody reads the terminal any more: later output goes to the log the parent chose.


def wait_gone(pid: int, timeout_s: float) -> bool:
    """Wait for a process that is not our child to exit; True once it has."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    except OSError:  # no pidfd here: look every 50 ms instead
        deadline = time.monotonic() + timeout_s
        while cluster_file.pid_alive(pid):
            if time.monotonic() > deadline:
                return False
            time.sleep(0.05)
        return True
    try:
        readable, _, _ = select.select([fd], [], [], timeout_s)  # readable once the process exited
        return bool(readable)
    finally:
        os.close(fd)


def stop_standing(settings: Settings) -> int | None:
    """Stop the cluster `fedqueue up` runs for these settings (warm: running tasks finish); its pid, or None."""
    path = cluster_file.cluster_path(settings)
    info = cluster_file.read(path)
    if info is None:
        return None
    path.unlink(missing_ok=True)  # no new `run` picks a cluster that is stopping
    if not cluster_file.pid_alive(info.pid):
        remove_cluster_files(settings.with_broker(info.broker_url))
        return None
    os.kill(info.pid, signal.SIGTERM)
    if not wait_gone(info.pid, DOWN_TIMEOUT_S):
        raise FedqueueError(f"fedqueue up (pid {info.pid}) did not stop within {DOWN_TIMEOUT_S:.0f} s")
    remove_cluster_files(settings.with_broker(info.broker_url))  # its workers' blobs in shared memory
    return info.pid


def with_local_broker(settings: Settings) -> Settings:
    """The settings' broker; else, for a command that needs one, the broker of the cluster `fedqueue up` runs for
    these settings (where one is up); else the settings as they are (no broker)."""
    if settings.broker_url:
        return settings
    standing = cluster_file.find(settings)
    return settings if standing is None else settings.with_broker(standing.broker_url)


def cluster_logs(settings: Settings) -> Path:
    """The log folder of the local cluster for these settings: the running one's, else where one writes them."""
    standing = cluster_file.find(settings)
    return Path(standing.log_dir) if standing is not None and standing.log_dir else cluster_file.log_dir(settings)
