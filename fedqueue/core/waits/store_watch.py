"""Following a run through a store outage: a full disk, a read-only database, a database that does not answer.

The follower's own steps (reading the run, renewing its lease, the repair pass) are all safe to repeat, and
the store keeps what was committed: while the store refuses them, the follower only has to wait. `StoreWatch`
runs such a step; one that fails for want of the store is replaced by its fallback and tried again with a
growing delay. Only the step itself can tell that the store is back (a full disk still answers reads), so
the step is the probe. One line says what the store lacks, one that it is back; past the store wait
(FEDQUEUE_STORE_WAIT_S) it gives up with `StoreGone`, naming the command that picks the run up again.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import ParamSpec, TypeVar

from sqlalchemy.exc import DBAPIError

from fedqueue.config import Settings
from fedqueue.core.infra_errors import infrastructure_fault
from fedqueue.core.waits.outage import FIRST_PROBE_S, LAST_PROBE_S
from fedqueue.errors import ServiceUnavailable

log = logging.getLogger(__name__)

P = ParamSpec("P")
T = TypeVar("T")


def store_trouble(err: BaseException) -> str | None:
    """What the store lacks under `err` ("disk full", "read-only", "unreachable"), or None when it is not the store."""
    fault = infrastructure_fault(err)
    if fault is None or not fault.startswith("store"):
        return None
    return fault.removeprefix("store").lstrip(": ")


def reason(err: BaseException) -> str:
    """The database's own first line for an error (without SQLAlchemy's wrapping and its help link)."""
    current: BaseException | None = err
    while current is not None and not isinstance(current, DBAPIError):
        current = current.__cause__ or current.__context__
    if current is not None and current.orig is not None:
        err = current.orig
    return ((str(err) or type(err).__name__).strip().splitlines() or [type(err).__name__])[0][:200]


class StoreGone(ServiceUnavailable):
    """The store refused the follower longer than the store wait; the run goes on once it is back."""


class StoreWatch:
    """Runs one follower's store steps through outages, and says what the store lacks and when it is back.

    `say` takes each line (a command prints it; the Python API logs it); `clock` is monotonic seconds.
    """

    def __init__(
        self,
        run_id: str,
        limit_s: float,
        say: Callable[[str], object] = log.warning,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.run_id = run_id
        self.limit_s = limit_s
        self._say = say
        self._clock = clock
        self._down_since: float | None = None
        self._cause = ""
        self._delay = FIRST_PROBE_S
        self._next_try = 0.0

    @classmethod
    def of(cls, settings: Settings, run_id: str, say: Callable[[str], object] | None = None) -> StoreWatch:
        """A watch giving up after the store wait of these settings; lines to `say`, else the log."""
        return cls(run_id, settings.store_wait_s, say or log.warning)

    @property
    def down(self) -> bool:
        """The store refused a step and no step went through since."""
        return self._down_since is not None

    def call(self, step: Callable[P, T], fallback: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """`step(*args)`, or `fallback(*args)` while the store is down and no try is due; StoreGone past the wait."""
        if self._down_since is not None:
            now = self._clock()
            if now < self._next_try and now - self._down_since < self.limit_s:
                return fallback(*args, **kwargs)
        started = self._clock()  # the store's own retries take seconds before a call fails
        try:
            result = step(*args, **kwargs)
        except Exception as err:
            cause = store_trouble(err)
            if cause is None:
                raise
            self._failed(cause, err, started)
            return fallback(*args, **kwargs)
        if self._down_since is not None:
            waited = self._clock() - self._down_since
            self._down_since = None
            self._say(f"store back after {waited:.0f} s: run {self.run_id} goes on")
        return result

    def _failed(self, cause: str, err: BaseException, since: float) -> None:
        if self._down_since is None:
            self._down_since = since
            self._cause = cause
            self._delay = FIRST_PROBE_S
            self._say(f"store: {cause}; waiting ({reason(err)})")
        else:
            self._delay = min(self._delay * 2, LAST_PROBE_S)
        self._next_try = self._clock() + self._delay
        waited = self._clock() - self._down_since
        if waited >= self.limit_s:
            raise StoreGone(
                f"store: {self._cause} for {waited:.0f} s (FEDQUEUE_STORE_WAIT_S is {self.limit_s:g}): run"
                f" {self.run_id} continues when its workers and store are back: `fedqueue resume {self.run_id}`"
            )
