"""A cluster on this machine: an embedded Redis and local workers, started and stopped together."""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

from fedqueue.config import Settings
from fedqueue.queue.embedded import EmbeddedRedis
from fedqueue.queue.workers import WorkerGroup, WorkerSpec


@dataclass
class LocalCluster:
    settings: Settings
    redis: EmbeddedRedis | None
    workers: WorkerGroup
    log_dir: Path

    @classmethod
    def start(cls, settings: Settings, specs: list[WorkerSpec], log_dir: Path | None = None) -> LocalCluster:
        """Start an embedded Redis if no broker is configured, then the workers; wait for them."""
        redis: EmbeddedRedis | None = None
        if not settings.broker_url:
            redis = EmbeddedRedis().start()
            settings = settings.with_broker(redis.url)
        log_dir = log_dir or Path(tempfile.mkdtemp(prefix="fedqueue-workers-"))
        workers = WorkerGroup(settings, specs, log_dir=log_dir)
        try:
            workers.start()
            workers.wait_ready()
        except BaseException:
            workers.stop(timeout_s=5)
            if redis is not None:
                redis.stop()
            raise
        return cls(settings=settings, redis=redis, workers=workers, log_dir=log_dir)

    def stop(self) -> None:
        self.workers.stop()
        if self.redis is not None:
            self.redis.stop()
