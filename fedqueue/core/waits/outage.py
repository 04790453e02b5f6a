"""Following a run through a broker outage: wait for the broker, say so once, go on when it is back.

Whoever follows a run (`fedqueue run`, `resume`, `llm submit`, `fedqueue.run()`) touches the broker in
its repair pass and, for some kinds, in its waits. When the broker stops answering, the workers keep
their tasks (Celery reconnects by itself) and the store keeps every result: the follower only has to
wait. `BrokerWatch` runs those steps. A step that fails for want of the broker is replaced by its
fallback (nothing repaired, a plain sleep) while the broker is probed with a growing delay; one line
says the broker went, one that it is back, and the steps run again (a broker that came back empty
is then repaired as any restarted broker). Past the broker wait (FEDQUEUE_BROKER_WAIT_S) it gives up
with `BrokerGone`, which names the command that picks the run up again.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator
from typing import ParamSpec, TypeVar

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from fedqueue.config import Settings
from fedqueue.core.infra_errors import infrastructure_fault
from fedqueue.core.services import check_broker_url
from fedqueue.errors import FedqueueError, ServiceUnavailable

log = logging.getLogger(__name__)

P = ParamSpec("P")
T = TypeVar("T")

FIRST_PROBE_S = 0.25  # the first probe after the broker went, then twice as long each time ...
LAST_PROBE_S = 2.0  # ... up to this: the follower's lease, renewed between probes, outlives the gap


class BrokerGone(ServiceUnavailable):
    """The broker stayed unreachable longer than the broker wait; the run goes on once it is back."""


class SubmitCutShort(FedqueueError):
    """The broker failed while a run was submitted, after its row was stored: the run is there, and its repair
    pass (in its follower, or a worker launcher that adopts it) sends what the submit did not."""

    def __init__(self, run_id: str, cause: BaseException) -> None:
        super().__init__(
            f"broker unreachable ({reason(cause)}) while run {run_id} was submitted: the run is stored; a worker"
            f" launcher (fedqueue worker, fedqueue up) sends what was not sent once the broker is back, or"
            f" `fedqueue resume {run_id}` does"
        )
        self.run_id = run_id
        self.cause = cause


@contextlib.contextmanager
def run_stored(run_id: str) -> Iterator[None]:
    """Around what a submit does once its run's row is stored: a broker that fails there leaves a run to finish
    submitting (SubmitCutShort), which its follower waits for, not a failed command."""
    try:
        yield
    except Exception as err:
        if not is_broker_error(err):
            raise
        raise SubmitCutShort(run_id, err) from err


def is_broker_error(err: BaseException) -> bool:
    """The broker failed, not the caller: a lost, refused or timed-out connection, a Redis at its maxmemory or
    read-only (fedqueue.core.infra_errors), or a publish error caused by one."""
    fault = infrastructure_fault(err)
    if fault is not None and fault.startswith("broker"):
        return True
    seen: set[int] = set()
    current: BaseException | None = err
    while current is not None and id(current) not in seen:
        if isinstance(current, redis.ConnectionError | redis.TimeoutError):
            return True
        # Celery's publish errors are kombu's OperationalError, named here so the core loads no Celery.
        kind = type(current)
        if kind.__name__ == "OperationalError" and kind.__module__.startswith("kombu"):
            return True
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return False


def ping_probe(url: str) -> Callable[[], None]:
    """One PING on a connection of its own, tried once: it answers, or raises at once when the broker is down."""

    def probe() -> None:
        client = redis.Redis.from_url(url, socket_connect_timeout=2, socket_timeout=5, retry=Retry(NoBackoff(), 0))
        try:
            client.ping()
        finally:
            client.close()

    return probe


def reason(err: BaseException) -> str:
    return (str(err) or type(err).__name__).strip().rstrip(".")


class BrokerWatch:
    """Runs one follower's broker steps through outages, and says when the broker goes and comes back.

    `say` takes each line (a command prints it; the Python API logs it). `probe` raises while the broker
    is unreachable; `clock` is monotonic seconds (tests pass their own).
    """

    def __init__(
        self,
        run_id: str,
        limit_s: float,
        probe: Callable[[], object],
        say: Callable[[str], object] = log.warning,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.run_id = run_id
        self.limit_s = limit_s
        self._probe = probe
        self._say = say
        self._clock = clock
        self._down_since: float | None = None
        self._delay = FIRST_PROBE_S
        self._next_probe = 0.0

    @classmethod
    def of(cls, settings: Settings, run_id: str, say: Callable[[str], object] | None = None) -> BrokerWatch:
        """A watch on the broker of these settings, giving up after their broker wait; lines to `say`, else the log."""
        return cls(run_id, settings.broker_wait_s, ping_probe(settings.broker_url or ""), say or log.warning)

    @property
    def down(self) -> bool:
        """The broker went and has not answered since."""
        return self._down_since is not None

    def check(self) -> bool:
        """Whether the broker is up: while it is down, probed when due (saying when it is back)."""
        return self._down_since is None or self._back()

    def guard(self, step: Callable[P, T], fallback: Callable[P, T]) -> Callable[P, T]:
        """`step` run through this watch: while the broker is down, `fallback` (same arguments) instead."""

        def guarded(*args: P.args, **kwargs: P.kwargs) -> T:
            return self.call(step, fallback, *args, **kwargs)

        return guarded

    def call(self, step: Callable[P, T], fallback: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """`step(*args)`, unless the broker is down (then `fallback(*args)`); raises BrokerGone past the wait."""
        if not self.check():
            return fallback(*args, **kwargs)
        started = self._clock()  # the broker's client tries again for a few seconds before it fails
        try:
            return step(*args, **kwargs)
        except Exception as err:
            if not is_broker_error(err):
                raise
            if self._answers():  # a connection that dropped while the broker stayed (or came back at once)
                log.info("run %s: a broker call failed (%s); the broker answers again", self.run_id, reason(err))
            else:
                self._went(err, started)
            return fallback(*args, **kwargs)

    def _answers(self) -> bool:
        try:
            self._probe()
        except Exception as err:
            if is_broker_error(err):
                return False
            raise
        return True

    def went(self, err: BaseException, line: str | None = None) -> None:
        """The broker failed under a step run outside this watch (a submit): down from now, saying `line` (else
        this watch's own)."""
        self._went(err, self._clock(), line)

    def wait_back(self, revive: Callable[[], object] | None = None) -> None:
        """Block until the broker answers again (BrokerGone past the wait); `revive` runs before each probe (it
        starts an embedded broker again)."""
        while not self.check():
            if revive is not None:
                revive()
            time.sleep(max(0.0, min(self._next_probe - self._clock(), LAST_PROBE_S)))

    def _went(self, err: BaseException, since: float, line: str | None = None) -> None:
        self._down_since = since
        self._delay = FIRST_PROBE_S
        self._next_probe = self._clock() + self._delay
        self._say(line or self._went_line(err))

    def _went_line(self, err: BaseException) -> str:
        return f"broker unreachable ({reason(err)}): waiting for it; the workers keep their tasks"

    def _back_line(self, waited: float) -> str:
        return f"broker back after {waited:.0f} s: run {self.run_id} goes on"

    def _gone(self, waited: float) -> BrokerGone:
        return BrokerGone(
            f"broker unreachable for {waited:.0f} s (FEDQUEUE_BROKER_WAIT_S is {self.limit_s:g}): run {self.run_id}"
            f" continues when its workers and broker are back: `fedqueue resume {self.run_id}`"
        )

    def _back(self) -> bool:
        """Whether the broker answers again (probed when due); raises BrokerGone once the wait is over."""
        assert self._down_since is not None
        now = self._clock()
        waited = now - self._down_since
        if now >= self._next_probe or waited >= self.limit_s:
            if self._answers():
                self._down_since = None
                self._say(self._back_line(waited))
                return True
            self._delay = min(self._delay * 2, LAST_PROBE_S)
            self._next_probe = self._clock() + self._delay
        if waited >= self.limit_s:
            raise self._gone(waited)
        return False


class SubmitWatch(BrokerWatch):
    """Waits for a broker that failed while a run was submitted, before anything of it was stored: the submit
    then starts again; given up, nothing is stored (exit 2: submit again)."""

    @classmethod
    def of(cls, settings: Settings, run_id: str = "", say: Callable[[str], object] | None = None) -> BrokerWatch:
        return cls(run_id, settings.broker_wait_s, ping_probe(settings.broker_url or ""), say or log.warning)

    def _went_line(self, err: BaseException) -> str:
        return f"broker unreachable ({reason(err)}): waiting for it; nothing of the run is stored yet"

    def _back_line(self, waited: float) -> str:
        return f"broker back after {waited:.0f} s: submitting again"

    def _gone(self, waited: float) -> BrokerGone:
        return BrokerGone(
            f"broker unreachable for {waited:.0f} s (FEDQUEUE_BROKER_WAIT_S is {self.limit_s:g}) while the run was"
            " submitted: nothing was stored; submit it again once the broker answers"
        )


def wait_for_broker(settings: Settings, run_id: str, say: Callable[[str], object] | None = None) -> None:
    """Return once the broker answers; while it does not, say so once, and once when it is back, as a follower
    does mid-run (`fedqueue resume` of a run whose broker is still down). Raises BrokerGone past the broker wait."""
    check_broker_url(settings.broker_url or "")
    watch = BrokerWatch.of(settings, run_id, say)
    watch.call(ping_probe(settings.broker_url or ""), _nothing)
    watch.wait_back()


def _nothing() -> None:
    """What a probe gives while the broker is down."""
