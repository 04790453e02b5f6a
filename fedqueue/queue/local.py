"""A cluster on this machine: an embedded Redis and local workers, started and stopped together."""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

from fedqueue.config import Settings
from fedqueue.errors import ServiceUnavailable
from fedqueue.queue.embedded import EmbeddedRedis
from fedqueue.queue.workers import WorkerGroup, WorkerSpec


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
        redis: EmbeddedRedis | None = None
        if not settings.broker_url:
            redis = EmbeddedRedis().start()
            settings = settings.with_broker(redis.url)
        log_dir = log_dir or Path(tempfile.mkdtemp(prefix="fedqueue-workers-"))
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
