"""The one process that schedules a run: it holds the run's lease and repairs it as it goes."""

from __future__ import annotations

import logging
import os
import socket
import time

from fedqueue.core import jobs
from fedqueue.core.services import Services
from fedqueue.errors import FedqueueError

log = logging.getLogger(__name__)

REPAIR_EVERY_S = 2.0


class LeaseHeld(FedqueueError):
    """Another live scheduler holds the run."""

    exit_code = 2


class RunSupervisor:
    def __init__(self, services: Services, run_id: str, owner: str | None = None) -> None:
        self.services = services
        self.run_id = run_id
        self.owner = owner or f"{socket.gethostname()}:{os.getpid()}"
        self._next_repair = 0.0

    def acquire(self) -> RunSupervisor:
        if not self.services.store.acquire_lease(self.run_id, self.owner, self.services.settings.lease_ttl_s):
            run = self.services.store.get_run(self.run_id)
            left = max(0.0, (run.lease_expires_at or 0) - time.time())
            raise LeaseHeld(
                f"run {self.run_id} is already scheduled by {run.lease_owner} "
                f"(its lease runs out {left:.0f} s after that scheduler stops)"
            )
        return self

    def tick(self) -> list[str]:
        """Renew the lease; every few seconds, repair the run. Returns the repairs made."""
        if not self.services.store.acquire_lease(self.run_id, self.owner, self.services.settings.lease_ttl_s):
            raise LeaseHeld(f"run {self.run_id}: lease lost to another scheduler")
        now = time.monotonic()
        if now < self._next_repair:
            return []
        self._next_repair = now + REPAIR_EVERY_S
        actions = repair(self.services, self.run_id)
        for action in actions:
            log.warning("run %s: %s", self.run_id, action)
        return actions

    def release(self) -> None:
        self.services.store.release_lease(self.run_id, self.owner)


def repair(services: Services, run_id: str) -> list[str]:
    """One repair pass over a run, by its job kind's own rules."""
    return jobs.get(services.store.get_run(run_id).kind).repair(services, run_id)
