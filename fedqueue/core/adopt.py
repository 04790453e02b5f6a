"""Runs heal without a follower: a worker launcher adopts running runs that nobody schedules.

Every few seconds the launcher looks for running runs whose lease is free or
expired, takes the lease (one holder per run, as for `fedqueue resume`), and runs
their repair pass while it holds them. So a plain `fedqueue submit` recovers from
a killed worker, a lost aggregator or a restarted Redis with no CLI left open.
"""

from __future__ import annotations

import logging
import os
import socket
import time

from fedqueue.core.services import Services
from fedqueue.core.supervisor import LAUNCHER_OWNER, LeaseHeld, RunSupervisor

log = logging.getLogger(__name__)

LOOK_EVERY_S = 2.0


class RunAdopter:
    def __init__(self, services: Services, owner: str | None = None) -> None:
        self.services = services
        self.owner = owner or f"{LAUNCHER_OWNER} {socket.gethostname()}:{os.getpid()}"
        self._held: dict[str, RunSupervisor] = {}
        self._next_look = 0.0

    def tick(self) -> list[str]:
        """Adopt free runs, renew and repair the adopted ones; returns what was done, one line each."""
        now = time.monotonic()
        if now < self._next_look:
            return []
        self._next_look = now + LOOK_EVERY_S
        actions: list[str] = []
        grace_s = self.services.settings.lease_ttl_s
        for run_id in self.services.store.unleased_runs(created_before=time.time() - grace_s):
            if run_id not in self._held:
                try:
                    self._held[run_id] = RunSupervisor(self.services, run_id, self.owner).acquire()
                    actions.append(f"run {run_id}: nobody was following it; adopted")
                except LeaseHeld:
                    continue  # another launcher was quicker
        for run_id, supervisor in list(self._held.items()):
            try:
                if self.services.store.get_run(run_id).state != "running":
                    supervisor.release()
                    del self._held[run_id]
                    continue
                actions += [f"run {run_id}: {action}" for action in supervisor.tick()]
            except LeaseHeld:
                del self._held[run_id]  # a scheduler (`fedqueue resume`) took it over
            except Exception as err:  # one run's broken repair must not stop the others, nor the workers
                log.exception("run %s: repair pass failed", run_id)
                actions.append(f"run {run_id}: repair pass failed ({err})")
        return actions

    def release_all(self) -> None:
        for supervisor in self._held.values():
            try:
                supervisor.release()
            except Exception as err:  # stopping anyway; the lease runs out by itself
                log.warning("lease not released (%s)", err)
        self._held.clear()
