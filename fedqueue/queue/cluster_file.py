"""Where `fedqueue up` leaves word of its cluster, so that `run` and the commands that need a broker reuse
it and `down` stops it; and where a local cluster's logs go.

One file per user and per set of worker settings (database, key prefix, plugin path, ...):
a `run` reuses a cluster only if its workers would write where the run reads. The file
is written once the workers are ready and removed before they stop.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from fedqueue.config import Settings
from fedqueue.errors import ServiceUnavailable

ALIVE_CHECK_TIMEOUT_S = 1.0


@dataclass(frozen=True)
class ClusterInfo:
    pid: int  # the `fedqueue up` process that supervises the cluster
    broker_url: str
    slots: dict[str, int]  # Celery hostname -> concurrent tasks
    log_dir: str


def runtime_dir() -> Path:
    base = os.environ.get("XDG_RUNTIME_DIR") or tempfile.gettempdir()
    return Path(base) / f"fedqueue-{os.getuid()}"


def _private(folder: Path) -> bool:
    """Ours and closed to others: a file planted by another user could point `run` at their broker."""
    try:
        info = folder.stat()
    except OSError:
        return False
    return info.st_uid == os.getuid() and not info.st_mode & 0o077


def _absolute_sqlite(url: str) -> str:
    """A relative SQLite path resolved against this directory: the same file from any shell."""
    prefix = "sqlite:///"
    if not url.startswith(prefix):
        return url
    path, _, query = url[len(prefix) :].partition("?")
    if not path or path == ":memory:" or path.startswith("/"):
        return url
    return prefix + os.path.abspath(path) + (f"?{query}" if query else "")


def worker_settings(settings: Settings) -> Settings:
    """The settings with relative paths made absolute, as a cluster's workers must see them."""
    from dataclasses import replace

    blob_dir = os.path.abspath(settings.blob_dir) if settings.blob_dir else None
    return replace(settings, database_url=_absolute_sqlite(settings.database_url), blob_dir=blob_dir)


def _digest(settings: Settings) -> str:
    """The worker settings, less the broker, as a short name: one cluster per set of them."""
    env = worker_settings(settings).to_env()
    env.pop("FEDQUEUE_BROKER_URL", None)
    return hashlib.sha256(json.dumps(env, sort_keys=True).encode()).hexdigest()[:16]


def cluster_path(settings: Settings) -> Path:
    return runtime_dir() / f"cluster-{_digest(settings)}.json"


def state_dir() -> Path:
    """fedqueue's folder of the user's state: what outlives a cluster (its logs)."""
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(base) / "fedqueue"


def log_dir(settings: Settings) -> Path:
    """Where the local cluster for these settings (`fedqueue up`'s, or the one `run` starts) writes its logs."""
    return state_dir() / "logs" / f"cluster-{_digest(settings)}"


def write(settings: Settings, info: ClusterInfo) -> Path:
    path = cluster_path(settings)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    if not _private(path.parent):
        raise ServiceUnavailable(f"{path.parent} is not a private folder of this user: the cluster is not announced")
    partial = path.with_suffix(f".{os.getpid()}.tmp")
    with open(os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as out:
        json.dump(asdict(info), out)
    os.replace(partial, path)  # readers see the whole file or none
    return path


def remove(settings: Settings, pid: int) -> None:
    """Remove the file if it still names this process (a newer `up` may have replaced it)."""
    path = cluster_path(settings)
    info = read(path)
    if info is not None and info.pid == pid:
        path.unlink(missing_ok=True)


def read(path: Path) -> ClusterInfo | None:
    """The file's cluster; None when there is none, it is unreadable, or its folder is not private."""
    if not _private(path.parent):
        return None
    try:
        raw = json.loads(path.read_text())
        return ClusterInfo(
            pid=int(raw["pid"]),
            broker_url=str(raw["broker_url"]),
            slots={str(name): int(slots) for name, slots in raw["slots"].items()},
            log_dir=str(raw["log_dir"]),
        )
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def pid_alive(pid: int) -> bool:
    """Running, not merely a zombie waiting to be reaped (a detached `up` has no parent that waits)."""
    import psutil

    try:
        return bool(psutil.Process(pid).status() != psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return False


def find(settings: Settings) -> ClusterInfo | None:
    """The running cluster `fedqueue up` started for these settings, if its broker answers."""
    import redis

    path = cluster_path(settings)
    info = read(path)
    if info is None:
        return None
    if not pid_alive(info.pid):
        path.unlink(missing_ok=True)  # its `up` was killed before it could clean up
        return None
    client = redis.Redis.from_url(info.broker_url, socket_connect_timeout=ALIVE_CHECK_TIMEOUT_S)
    try:
        client.ping()
    except redis.RedisError:
        return None
    finally:
        client.close()
    return info


@contextlib.contextmanager
def announced(settings: Settings, info: ClusterInfo) -> Iterator[Path]:
    """The cluster file for the block: written on entry, removed on the way out."""
    path = write(settings, info)
    try:
        yield path
    finally:
        remove(settings, info.pid)
