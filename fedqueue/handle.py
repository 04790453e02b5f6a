"""A run of any kind once it is submitted: read back from the store, waited for, cancelled.

Every kind's handle is built on `RunHandle` (FL's fedqueue.fl.api.RunHandle, LLM's JobHandle).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Self

from fedqueue.config import Settings
from fedqueue.errors import FedqueueError

# `import fedqueue` stays light: the store (sqlalchemy) and Redis load when a run is read or cancelled.
if TYPE_CHECKING:
    from fedqueue.core.waits.store_watch import StoreWatch
    from fedqueue.store import Store


class RunHandle:
    """One submitted run of any kind, read back from the store."""

    def __init__(self, run_id: str, settings: Settings) -> None:
        self.id = run_id
        self.settings = settings
        self._store: Store | None = None
        # The broker error that cut its submit short after the run was stored: its follower starts out waiting.
        self.submit_cut: BaseException | None = None

    @classmethod
    def of(cls, handle: RunHandle) -> Self:
        """The same run behind a kind's own handle."""
        same = cls(handle.id, handle.settings)
        same.submit_cut = handle.submit_cut
        return same

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.id!r})"

    @property
    def store(self) -> Store:
        if self._store is None:
            from fedqueue.core.database import open_store

            self._store = open_store(self.settings.database_url)
        return self._store

    @property
    def state(self) -> str:
        return self.store.get_run(self.id).state

    def cancel(self, reason: str = "cancelled by the user") -> Cancellation:
        """Cancel the run (see `cancel`)."""
        return cancel(self.id, self.settings, reason)

    def status(self) -> dict[str, Any]:
        """State, tasks, workers, max_concurrency, failures, and what the run's kind adds."""
        from fedqueue.report.summary import run_summary

        return run_summary(self.store, self.id)

    def wait(
        self,
        timeout_s: float | None = None,
        poll_s: float = 0.2,
        tick: Callable[[], object] | None = None,
        store_watch: StoreWatch | None = None,
        pause: Callable[[float], object] = time.sleep,
    ) -> dict[str, Any]:
        """Block until the run finishes or fails; return its status. `tick` runs on every poll; `pause(poll_s)`
        between polls (a kind's wait may return as soon as its workers store something).

        The tick of `scheduling()` (or `keep_running`) waits through a broker outage; it raises
        BrokerGone once the broker stayed away longer than FEDQUEUE_BROKER_WAIT_S. Each poll goes through
        `store_watch` (the supervisor's): while the store refuses it, the poll waits; past
        FEDQUEUE_STORE_WAIT_S, StoreGone.
        """
        deadline = None if timeout_s is None else time.monotonic() + timeout_s

        def poll() -> bool:
            """Whether the run is still running; a tick if so."""
            if self.state != "running":
                return False
            if tick is not None:
                tick()
            return True

        while poll() if store_watch is None else store_watch.call(poll, _still_running):
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"run {self.id} still running after {timeout_s} s")
            pause(poll_s)
        return self.status()


def _still_running() -> bool:
    """What a poll tells while the store refuses it."""
    return True


@dataclass(frozen=True)
class Cancellation:
    """What `cancel` did."""

    run_id: str
    was: str  # "running" when this call cancelled it; else the state the run had already ended in
    dropped: int | None = None  # queued tasks removed from the broker; None when it was not reached
    broker_error: str | None = None  # why the broker was not reached (its workers skip the run's tasks instead)

    @property
    def cancelled_now(self) -> bool:
        return self.was == "running"


def cancel(run_id: str, settings: Settings | None = None, reason: str = "cancelled by the user") -> Cancellation:
    """Cancel a running run of any kind: state `cancelled` in the store (final: nothing resumes it), its
    queued tasks removed from the broker of `settings` (where one is configured and answers); tasks that
    workers hold are skipped, and running ones finish. An ended run is left as it is (`was` tells its state)."""
    from fedqueue.core.database import open_store
    from fedqueue.core.runs.cancel import CANCELLED, cancel_run

    settings = settings or Settings.from_env()
    store = open_store(settings.database_url)
    try:
        was = cancel_run(store, run_id, reason)
    finally:
        store.close()
    if was not in ("running", CANCELLED) or not settings.broker_url:
        return Cancellation(run_id, was)
    try:
        dropped = drop_queued_tasks(settings, run_id)
    except FedqueueError as err:
        return Cancellation(run_id, was, broker_error=str(err))
    return Cancellation(run_id, was, dropped)


def drop_queued_tasks(settings: Settings, run_id: str) -> int:
    """Remove a run's queued tasks from the broker of `settings`; how many (ServiceUnavailable when it is down)."""
    import redis

    from fedqueue.core.services import connect_redis
    from fedqueue.errors import ServiceUnavailable
    from fedqueue.queue.purge import drop_queued

    client = connect_redis(settings.broker_url or "")
    try:
        return drop_queued(client, settings, run_id)
    except redis.RedisError as err:
        raise ServiceUnavailable(f"broker: {err}") from None
    finally:
        client.close()
