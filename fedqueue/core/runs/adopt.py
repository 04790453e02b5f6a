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

from fedqueue.core.runs.supervisor import LAUNCHER_OWNER, LeaseHeld, RunSupervisor
from fedqueue.core.services import Services

log = logging.getLogger(__name__)

LOOK_EVERY_S = 2.0
# After a look that failed (the store or the broker unreachable, a disk full), the next waits longer, up to this.
BACKOFF_MAX_S = 30.0


def unavailable(err: Exception) -> str:
    """Which service failed, as one line: the store for a database error, the broker for a Redis one."""
    origin = type(err).__module__.split(".")[0]
    where = {"sqlalchemy": "store", "redis": "broker"}.get(origin, "store or broker")
    reason = (str(err).strip().splitlines() or [type(err).__name__])[0][:200]
    return f"{where} unavailable ({type(err).__name__}: {reason})"


class RunAdopter:
    def __init__(self, services: Services, owner: str | None = None) -> None:
        self.services = services
        self.owner = owner or f"{LAUNCHER_OWNER} {socket.gethostname()}:{os.getpid()}"
        self._held: dict[str, RunSupervisor] = {}
        self._next_look = 0.0
        self._backoff_s = 0.0  # above 0 while the store or the broker is down

    def tick(self) -> list[str]:
        """Adopt free runs, renew and repair the adopted ones; returns what was done, one line each.

        Never raises for a store or broker that is down: the launcher's workers go on with their tasks,
        and the next look waits longer (one line when it goes, one when it is back).
        """
        now = time.monotonic()
        if now < self._next_look:
            return []
        try:
            actions = self._look()
        except Exception as err:  # a store or broker error (connection lost, disk full, read-only): wait it out
            first = self._backoff_s == 0
            self._backoff_s = min(BACKOFF_MAX_S, max(LOOK_EVERY_S, 2 * self._backoff_s))
            self._next_look = now + self._backoff_s
            line = (
                f"{unavailable(err)}: the workers keep their tasks; adopting and repairing runs again once it is back"
            )
            log.warning("%s (next try in %.0f s)", line, self._backoff_s)
            return [line] if first else []
        self._next_look = now + LOOK_EVERY_S
        if self._backoff_s:
            self._backoff_s = 0.0
            actions.insert(0, "store and broker reachable again: adopting and repairing runs")
        return actions

    def _look(self) -> list[str]:
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
