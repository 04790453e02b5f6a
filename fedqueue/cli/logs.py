"""`fedqueue logs`: the last lines of a local cluster's logs, one file per worker, and what they write next."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from fedqueue.errors import FedqueueError

FOLLOW_POLL_S = 0.25
BLOCK = 64 * 1024


def log_name(path: Path) -> str:
    """A log's short name: the worker's (cpu0, gpu1) or `up` for the cluster's own output."""
    return path.stem.removeprefix("worker-")


def last_lines(path: Path, count: int) -> tuple[list[str], int]:
    """The file's last `count` lines, and its size (where following it goes on from)."""
    with path.open("rb") as file:
        size = file.seek(0, os.SEEK_END)
        if count == 0:
            return [], size
        data = b""
        position = size
        while position > 0 and data.count(b"\n") <= count:
            step = min(BLOCK, position)
            position -= step
            file.seek(position)
            data = file.read(step) + data
    found = data.decode(errors="replace").splitlines()
    return found[-count:], size


def _print(name: str, lines: list[str]) -> None:
    for line in lines:
        sys.stdout.write(f"{name} | {line}\n")
    sys.stdout.flush()


def show_logs(folder: Path, count: int, follow: bool) -> None:
    """Print each log's last `count` lines; with `follow`, then what is written to any log until Ctrl-C."""
    logs = sorted(folder.glob("*.log")) if folder.is_dir() else []
    if not logs and not follow:
        raise FedqueueError(f"no logs in {folder} yet: `fedqueue up` (or `fedqueue run`) writes its workers' there")
    offsets: dict[Path, int] = {}
    try:
        for path in logs:
            lines, offsets[path] = last_lines(path, count)
            _print(log_name(path), lines)
        if follow:
            _follow(folder, offsets)
    except KeyboardInterrupt:
        return
    except BrokenPipeError:  # `fedqueue logs | head`: the reader has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def _follow(folder: Path, offsets: dict[Path, int]) -> None:
    partial: dict[Path, bytes] = {}
    while True:
        for path in sorted(folder.glob("*.log")) if folder.is_dir() else []:
            try:
                size = path.stat().st_size
            except OSError:
                continue
            offset = offsets.get(path, 0)
            if size < offset:  # moved aside and begun again when its cluster started
                offset = 0
            if size == offset:
                continue
            with path.open("rb") as file:
                file.seek(offset)
                data = partial.pop(path, b"") + file.read(size - offset)
            offsets[path] = size
            complete, _, rest = data.rpartition(b"\n")
            if rest:
                partial[path] = rest  # a line still being written: printed once it ends
            if complete or data.endswith(b"\n"):
                _print(log_name(path), complete.decode(errors="replace").split("\n"))
        time.sleep(FOLLOW_POLL_S)
