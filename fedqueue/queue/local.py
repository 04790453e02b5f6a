"""A cluster on this machine: an embedded Redis and local workers, started and stopped together."""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path

from fedqueue.config import Settings
from fedqueue.core.broker.shm import remove_cluster_files
from fedqueue.errors import ServiceUnavailable
from fedqueue.queue import cluster_file
from fedqueue.queue.embedded import EmbeddedRedis
from fedqueue.queue.workers import WorkerGroup, WorkerSpec

# A log file past this size is moved to NAME.1 (replacing the one before) when its cluster starts.
LOG_KEEP_BYTES = 8 * 1024 * 1024


def prepare_log_dir(folder: Path) -> Path:
    """The log folder made (private: logs may name URLs and paths), its large logs moved aside."""
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    for log in folder.glob("*.log"):
        with contextlib.suppress(OSError):  # another cluster's start moved it first
            if log.stat().st_size > LOG_KEEP_BYTES:
                os.replace(log, log.with_name(log.name + ".1"))
    return folder


@dataclass
class LocalCluster:
    settings: Settings
    redis: EmbeddedRedis | None
    workers: WorkerGroup
    log_dir: Path

    @classmethod
    def launch(cls, settings: Settings, specs: list[WorkerSpec], log_dir: Path | None = None) -> LocalCluster:
        """Start an embedded Redis if no broker is configured, then the workers; do not wait for them.

        Redis answers when this returns; the workers take whatever is queued once they are up,
        so a caller can submit while they start.
        """
        # The known folder for these settings (`fedqueue logs` reads it), unless the caller names one.
        log_dir = prepare_log_dir(log_dir or cluster_file.log_dir(settings))
        redis: EmbeddedRedis | None = None
        if not settings.broker_url:
            redis = EmbeddedRedis().start()
            settings = settings.with_broker(redis.url)
        workers = WorkerGroup(settings, specs, log_dir=log_dir)
        try:
            workers.start()
        except BaseException:
            if redis is not None:
                redis.stop()
            raise
        return cls(settings=settings, redis=redis, workers=workers, log_dir=log_dir)

    @classmethod
    def start(cls, settings: Settings, specs: list[WorkerSpec], log_dir: Path | None = None) -> LocalCluster:
        """Launch, then wait until every worker consumes and has warmed up."""
        cluster = cls.launch(settings, specs, log_dir)
        try:
            cluster.workers.wait_ready()
        except BaseException:
            cluster.stop(timeout_s=5)
            raise
        return cluster

    def restart_exited_broker(self) -> bool:
        """Start the embedded Redis again, empty and on its port, if it exited; True when it did.

        Nothing else would: its workers and the run's follower wait for it (the run's repair pass then
        sends again what the empty Redis forgot). A port taken meanwhile is tried again at the next call.
        """
        if self.redis is None or self.redis.alive():
            return False
        port = self.redis.port
        self.redis.stop()
        try:
            self.redis = EmbeddedRedis(port=port).start()
        except ServiceUnavailable:
            return False
        return True

    def stop(self, timeout_s: float = 60.0) -> None:
        self.workers.stop(timeout_s=timeout_s)
        if self.redis is not None:
            self.redis.stop()
            remove_cluster_files(self.settings)  # its blobs in shared memory go with its broker's
