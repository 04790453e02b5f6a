"""The task ledger: what the queue keeps about tasks besides their messages, and the broker's own state.

Tasks are named by their `attempt_key` (a kind's own string, such as `run:round:device`). The
ledger counts each task's attempts, and apart those whose code raised (the others were lost with
their worker), marks it running while a worker's heartbeat lasts, and keeps the marks repair
passes leave (requeued, timed out, stranded, enqueued, requested). Kinds keep a few short values
(notes) and wake-ups in it too. `RedisLedger` keeps it all in Redis under the keys
of `fedqueue.core.broker.keys`; `fedqueue.core.broker.memory.MemoryLedger` is its in-memory twin for tests.
"""

from __future__ import annotations

import logging
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol

import redis

from fedqueue.config import Settings
from fedqueue.core.broker import keys
from fedqueue.core.broker.heartbeats import Heartbeats

log = logging.getLogger(__name__)

ROOM_FIRST_PAUSE_S = 0.25  # a write refused for want of broker memory tries again after this, doubled ...
ROOM_MAX_PAUSE_S = 5.0  # ... up to this

WAKE_KEEP_S = 3600  # a wake-up nobody waits for goes away on its own


class TaskLedger(Protocol):
    def start_attempt(self, task_key: str, worker: str) -> int:
        """Count this delivery of a task and mark it running, at once; returns its attempt number."""
        ...

    def take_back_attempt(self, task_key: str) -> None:
        """This delivery gave its work back undone: do not count it."""
        ...

    def heartbeat(self, task_key: str, worker: str) -> AbstractContextManager[None]:
        """Keep the running mark of a started task alive while the block runs (it expires a heartbeat after)."""
        ...

    def hold(self, task_key: str, worker: str) -> None:
        """Keep a task marked as running for one heartbeat period (a retry is on its way)."""
        ...

    def attempts(self, task_key: str) -> int:
        """How many deliveries of this task have started so far."""
        ...

    def attempts_of(self, task_keys: Sequence[str]) -> dict[str, int]: ...

    def count_raised(self, task_key: str) -> int:
        """One more attempt of this task ended in an error its own code raised; returns how many did so far."""
        ...

    def raised_of(self, task_keys: Sequence[str]) -> dict[str, int]: ...

    def used_up(self, task_key: str, attempts: int) -> bool:
        """No attempt is left after `attempts` finished ones: max_attempts raised, or max_lost_attempts lost."""
        ...

    def running_of(self, task_keys: Sequence[str]) -> dict[str, bool]: ...

    def requeued_of(self, task_keys: Sequence[str]) -> dict[str, int | None]: ...

    def reset_attempts(self, task_key: str) -> None:
        """A task run again and again (a run's fold pass) counts only its failures in a row (raised and lost)."""
        ...

    def mark_requeued(self, task_key: str, attempts: int) -> None:
        """A repair pass enqueued the task again after its `attempts`-th delivery was lost."""
        ...

    def mark_timed_out(self, task_key: str) -> None:
        """A delivery of this task ran past the time limit (its worker is about to end itself)."""
        ...

    def lost_reason(self, task_key: str, attempts: int) -> str:
        """Why a task whose attempts ran out without an error of its own (lost or timed out) is given up on."""
        ...

    def stranded_long_enough(self, task_key: str) -> bool:
        """Note a task seen neither queued, running nor done; True once it was seen so a heartbeat ago."""
        ...

    def mark_enqueued(self, group_key: str) -> None:
        """Every task of a group (a round, a batch plan) is on the queue: written after the last one was sent."""
        ...

    def was_enqueued(self, group_key: str) -> bool: ...

    def request_once(self, task_key: str, within_s: float) -> bool:
        """True for the first caller in `within_s` seconds: keeps repair passes from sending a task again and again."""
        ...

    def renew_request(self, task_key: str, within_s: float) -> None:
        """Keep a request marked for `within_s` more seconds (its task is still at work on it)."""
        ...

    def is_requested(self, task_key: str) -> bool:
        """A request of this task is marked (made and not yet taken up)."""
        ...

    def forget_request(self, task_key: str) -> None:
        """The next `request_once` of this task goes through."""
        ...

    def forget_run_marks(self, run_id: str) -> None:
        """Forget the attempts, requeue, time-out and request marks of every task of a run (a failed run retried)."""
        ...

    def broker_id(self) -> str:
        """The broker's identity: it changes when the broker restarts (and, without persistence, forgets everything)."""
        ...

    def queue_length(self, queue: str) -> int:
        """Messages waiting on one of the queues (by suffix), not those delivered and unacknowledged."""
        ...

    def put_note(self, key: str, value: str, keep_s: int | None = None) -> None:
        """Keep a short value under `key` (a `fedqueue.core.broker.keys` name) for `keep_s` (default blob_ttl_s)."""
        ...

    def note(self, key: str) -> str | None: ...

    def drop_note(self, key: str) -> None: ...

    def wake(self, key: str) -> None:
        """Wake whoever waits on `key` (or its next wait); best effort: a failure is logged, not raised."""
        ...

    def wait_for_wake(self, key: str, timeout_s: float) -> bool:
        """Wait at most `timeout_s` for a wake-up on `key`; every wake-up sent meanwhile is used up at once."""
        ...

    def close(self) -> None: ...


Family = Callable[[str, str], str]  # a key family of fedqueue.core.broker.keys: (prefix, task key) -> key
# The marks that decide whether a task is tried again: a failed run retried starts them afresh.
RUN_MARK_FAMILIES: tuple[Family, ...] = (keys.attempts, keys.raised, keys.requeued, keys.timed_out, keys.requested)


class LedgerReads(ABC):
    """The ledger's reads, over one primitive its stores give: the values of one family's keys for some tasks."""

    settings: Settings

    @abstractmethod
    def _many(self, family: Family, task_keys: Sequence[str]) -> list[Any | None]: ...

    def _key(self, family: Family, task_key: str) -> str:
        return family(self.settings.key_prefix, task_key)

    def attempts(self, task_key: str) -> int:
        return int(self._many(keys.attempts, [task_key])[0] or 0)

    def attempts_of(self, task_keys: Sequence[str]) -> dict[str, int]:
        values = self._many(keys.attempts, task_keys)
        return {key: int(value or 0) for key, value in zip(task_keys, values, strict=True)}

    def raised_of(self, task_keys: Sequence[str]) -> dict[str, int]:
        values = self._many(keys.raised, task_keys)
        return {key: int(value or 0) for key, value in zip(task_keys, values, strict=True)}

    def used_up(self, task_key: str, attempts: int) -> bool:
        raised = self.raised_of([task_key])[task_key]
        return raised >= self.settings.max_attempts or attempts - raised >= self.settings.max_lost_attempts

    def running_of(self, task_keys: Sequence[str]) -> dict[str, bool]:
        values = self._many(keys.running, task_keys)
        return {key: value is not None for key, value in zip(task_keys, values, strict=True)}

    def requeued_of(self, task_keys: Sequence[str]) -> dict[str, int | None]:
        values = self._many(keys.requeued, task_keys)
        return {key: None if value is None else int(value) for key, value in zip(task_keys, values, strict=True)}

    def lost_reason(self, task_key: str, attempts: int) -> str:
        limit = self._many(keys.timed_out, [task_key])[0]
        raised = self.raised_of([task_key])[task_key]
        if limit is not None and raised >= attempts:
            return f"time limit exceeded ({int(limit)} s) on each of {attempts} attempts"
        lost = attempts - raised
        if raised == 0:
            return f"worker lost during each of {attempts} attempts (crashed or killed)"
        return f"worker lost during {lost} of {attempts} attempts (crashed or killed); the others failed"

    def was_enqueued(self, group_key: str) -> bool:
        return self._many(keys.enqueued, [group_key])[0] is not None

    def is_requested(self, task_key: str) -> bool:
        return self._many(keys.requested, [task_key])[0] is not None


class RedisLedger(LedgerReads):
    """The task ledger in the broker's Redis: it survives any worker and scheduler crashing.

    `clock` gives the wall time a stranded task is first seen at (tests pass their own).
    """

    def __init__(self, client: redis.Redis, settings: Settings, clock: Callable[[], float] = time.time) -> None:
        self.redis = client
        self.settings = settings
        self._clock = clock
        self._heartbeats = Heartbeats(client, settings.heartbeat_ttl_s)

    def start_attempt(self, task_key: str, worker: str) -> int:
        """Count this delivery of a task and mark it running, in one atomic call.

        Both in one transaction: a scheduler that sees the attempt counted also sees the
        task running, so it never takes a task that is just starting for a lost one.
        The count lives in Redis, so it survives the worker crashing.
        """
        attempts = self._key(keys.attempts, task_key)
        with self.redis.pipeline(transaction=True) as pipe:
            pipe.incr(attempts)
            pipe.expire(attempts, self.settings.blob_ttl_s)
            pipe.set(self._key(keys.running, task_key), worker, ex=self.settings.heartbeat_ttl_s)
            count, _, _ = pipe.execute()
        return int(count)

    def take_back_attempt(self, task_key: str) -> None:
        """This delivery gave its work back undone (it waited for something that did not come): do not count it."""
        attempts = self._key(keys.attempts, task_key)
        if self.redis.decr(attempts) < 0:
            self.redis.set(attempts, 0, ex=self.settings.blob_ttl_s)

    def heartbeat(self, task_key: str, worker: str) -> AbstractContextManager[None]:
        """Keep the running mark of a started task alive while the block runs.

        The mark expires `heartbeat_ttl_s` after its worker dies, which is how a scheduler
        tells a lost task from a running one. It is left to expire after the block too: a
        stored result outranks a running mark, and deleting it would cost a round trip per task.
        """
        return self._heartbeats.beating(self._key(keys.running, task_key), worker)

    def hold(self, task_key: str, worker: str) -> None:
        self.redis.set(self._key(keys.running, task_key), worker, ex=self.settings.heartbeat_ttl_s)

    def count_raised(self, task_key: str) -> int:
        raised = self._key(keys.raised, task_key)
        with self.redis.pipeline(transaction=True) as pipe:
            pipe.incr(raised)
            pipe.expire(raised, self.settings.blob_ttl_s)
            count, _ = pipe.execute()
        return int(count)

    def _many(self, family: Family, task_keys: Sequence[str]) -> list[Any | None]:
        if not task_keys:
            return []
        values: list[Any | None] = self.redis.mget([self._key(family, task_key) for task_key in task_keys])
        return values

    def reset_attempts(self, task_key: str) -> None:
        self.redis.delete(self._key(keys.attempts, task_key), self._key(keys.raised, task_key))

    def mark_requeued(self, task_key: str, attempts: int) -> None:
        self.redis.set(self._key(keys.requeued, task_key), attempts, ex=self.settings.blob_ttl_s)

    def mark_timed_out(self, task_key: str) -> None:
        limit = self.settings.task_time_limit_s
        self.redis.set(self._key(keys.timed_out, task_key), limit, ex=self.settings.blob_ttl_s)

    def stranded_long_enough(self, task_key: str) -> bool:
        """Note a task seen neither queued, running nor done; True once it was seen so a heartbeat ago.

        Such a message was delivered to a worker that died before starting it: it waits
        unacknowledged until the visibility timeout. Two sightings a heartbeat apart rule
        out a worker that had only just taken it.
        """
        key = self._key(keys.stranded, task_key)
        now = self._clock()
        if self.redis.set(key, now, nx=True, ex=self.settings.heartbeat_ttl_s * 10):
            return False
        first_seen = float(self.redis.get(key) or now)
        if now - first_seen < self.settings.heartbeat_ttl_s:
            return False
        self.redis.delete(key)
        return True

    def mark_enqueued(self, group_key: str) -> None:
        # Written right after the group's publish, which waits for room in a full Redis: the publish itself can
        # take the room made, so this write waits the same way (up to the broker wait) instead of failing the submit.
        pause, waited = ROOM_FIRST_PAUSE_S, 0.0
        while True:
            try:
                self.redis.set(self._key(keys.enqueued, group_key), 1, ex=self.settings.blob_ttl_s)
                return
            except redis.exceptions.OutOfMemoryError:
                if waited >= self.settings.broker_wait_s:
                    raise
                time.sleep(pause)
                waited += pause
                pause = min(2 * pause, ROOM_MAX_PAUSE_S)

    def request_once(self, task_key: str, within_s: float) -> bool:
        return bool(self.redis.set(self._key(keys.requested, task_key), 1, nx=True, ex=request_ttl_s(within_s)))

    def renew_request(self, task_key: str, within_s: float) -> None:
        self.redis.expire(self._key(keys.requested, task_key), request_ttl_s(within_s))

    def forget_request(self, task_key: str) -> None:
        self.redis.delete(self._key(keys.requested, task_key))

    def forget_run_marks(self, run_id: str) -> None:
        # Attempt keys hold their run's id (`RUN:3:7`, `aggregate:RUN:3`, `fold:RUN`, `llm:RUN:2`), not always first.
        for family in RUN_MARK_FAMILIES:
            pattern = self._key(family, f"*{run_id}*")
            names = list(self.redis.scan_iter(match=pattern, count=1000))
            if names:
                self.redis.delete(*names)

    def broker_id(self) -> str:
        """Redis's own run_id: it changes when the server restarts (and, without persistence, forgets everything)."""
        return str(self.redis.info("server")["run_id"])

    def queue_length(self, queue: str) -> int:
        return int(self.redis.llen(keys.queue_list(self.settings.key_prefix, self.settings.queue(queue))))

    def put_note(self, key: str, value: str, keep_s: int | None = None) -> None:
        self.redis.set(key, value, ex=keep_s or self.settings.blob_ttl_s)

    def note(self, key: str) -> str | None:
        value = self.redis.get(key)
        return value.decode() if isinstance(value, bytes) else value

    def drop_note(self, key: str) -> None:
        self.redis.delete(key)

    def wake(self, key: str) -> None:
        try:
            with self.redis.pipeline() as pipe:
                pipe.rpush(key, 1)
                pipe.expire(key, WAKE_KEEP_S)
                pipe.execute()
        except redis.RedisError as err:
            log.warning("wake-up %s not sent (%s); whoever waits on it polls instead", key, err)

    def wait_for_wake(self, key: str, timeout_s: float) -> bool:
        if not self.redis.blpop([key], timeout=timeout_s):
            return False
        self.redis.delete(key)  # one wake-up for every one sent meanwhile
        return True

    def close(self) -> None:
        self.redis.close()


def request_ttl_s(within_s: float) -> int:
    """A request mark's lifetime: whole seconds, one at least (what Redis's EX takes)."""
    return max(1, int(within_s))
