"""The one process that schedules a run: it holds the run's lease and repairs it as it goes."""

from __future__ import annotations

import logging
import os
import socket
import time

from fedqueue.core import jobs
from fedqueue.core.services import Services
from fedqueue.core.waits.outage import BrokerWatch
from fedqueue.core.waits.room import BrokerRoom
from fedqueue.core.waits.store_watch import StoreWatch, store_trouble
from fedqueue.core.waits.unread import UnreadQueues
from fedqueue.errors import FedqueueError

log = logging.getLogger(__name__)

REPAIR_EVERY_S = 2.0


class LeaseHeld(FedqueueError):
    """Another live scheduler holds the run."""

    exit_code = 2


# Lease owners of this form are worker launchers that adopted a run nobody followed (fedqueue.core.runs.adopt).
LAUNCHER_OWNER = "worker launcher"


class RunSupervisor:
    """Holds a run's lease and repairs it.

    A follower (`fedqueue run`, `resume`) that finds a worker launcher holding the lease follows the
    run without repairing it (the launcher does), and takes the lease over once the launcher lets go.
    Another live follower is refused: one scheduler per run.

    With a `watch`, the repair pass goes through it: while the broker is unreachable the lease is still
    renewed (it lives in the store), repairs wait for the broker, and the watch says when it goes and
    comes back (see fedqueue.core.waits.outage). Without, a broker error is raised to the caller.

    With a `store_watch`, taking the lease waits through a store outage (the follower's loop runs its
    ticks through the same watch: fedqueue.core.waits.store_watch), and letting it go is best effort.

    With `unread`, each tick also looks (every few seconds) for the run's queues that no worker reads, and
    says so (fedqueue.core.waits.unread). With `room`, it says when the broker is at its maxmemory and when it has
    room again (fedqueue.core.waits.room).
    """

    def __init__(
        self,
        services: Services,
        run_id: str,
        owner: str | None = None,
        watch: BrokerWatch | None = None,
        store_watch: StoreWatch | None = None,
        unread: UnreadQueues | None = None,
        room: BrokerRoom | None = None,
    ) -> None:
        self.services = services
        self.run_id = run_id
        self.owner = owner or f"{socket.gethostname()}:{os.getpid()}"
        self.watch = watch
        self.store_watch = store_watch
        self.unread = unread
        self.room = room
        self._next_repair = 0.0

    def _take(self) -> bool:
        """Hold (or renew) the lease; False when a launcher holds it and this follower defers to it."""
        if self.services.store.acquire_lease(self.run_id, self.owner, self.services.settings.lease_ttl_s):
            return True
        run = self.services.store.get_run(self.run_id)
        holder = run.lease_owner or ""
        if holder.startswith(LAUNCHER_OWNER) and not self.owner.startswith(LAUNCHER_OWNER):
            return False
        left = max(0.0, (run.lease_expires_at or 0) - time.time())
        raise LeaseHeld(
            f"run {self.run_id} is already scheduled by {holder} "
            f"(its lease runs out {left:.0f} s after that scheduler stops)"
        )

    def acquire(self) -> RunSupervisor:
        if self.store_watch is None:
            self._take()
        else:  # a store that refuses the lease now: the first tick that goes through takes it
            self.store_watch.call(self._take, _not_taken)
        return self

    def tick(self) -> list[str]:
        """Renew the lease; every few seconds, repair the run. Returns the repairs made."""
        # Whoever holds the lease, this follower says when the broker is full and when no worker reads its queues
        # (the room first: queues are not called unread while the broker is full).
        for look in (self.room, self.unread):
            if look is not None and self.watch is not None:
                self.watch.call(look.check, _nothing)
            elif look is not None:
                look.check()
        if not self._take():
            if self.watch is not None:
                self.watch.check()  # the launcher repairs; this follower still says when the broker is back
            return []
        now = time.monotonic()
        if now < self._next_repair:
            return []
        self._next_repair = now + REPAIR_EVERY_S
        try:
            actions = self._repair() if self.watch is None else self.watch.call(self._repair, _no_repairs)
        except Exception:
            self._next_repair = 0.0  # the next tick tries the pass again (the store may refuse it for a while)
            raise
        for action in actions:
            log.warning("run %s: %s", self.run_id, action)
        return actions

    def _repair(self) -> list[str]:
        return repair(self.services, self.run_id)

    def release(self) -> None:
        if self.room is not None:
            self.room.close()
        try:
            self.services.store.release_lease(self.run_id, self.owner)
        except Exception as err:
            if self.store_watch is None or store_trouble(err) is None:
                raise
            # Leaving anyway (finished, or given up on the store): the lease runs out by itself.
            log.warning("run %s: lease not released (store: %s)", self.run_id, store_trouble(err))


def _nothing() -> None:
    """What looking at the queues does while the broker is unreachable."""


def _not_taken() -> bool:
    """What taking the lease gave while the store refuses it."""
    return False


def _no_repairs() -> list[str]:
    """What a repair pass made while the broker is unreachable."""
    return []


def repair(services: Services, run_id: str) -> list[str]:
    """One repair pass over a run, by its job kind's own rules."""
    return jobs.get(services.store.get_run(run_id).kind).repair(services, run_id)
