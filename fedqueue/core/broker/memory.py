"""In-memory twins of the task ledger and the blob store, and an enqueuer that keeps what it is given.

For tests of scheduling and repair with no Redis and no workers: `memory_services(settings, store)`
gives `Services` whose ledger and blobs live in this process with the Redis ones' semantics (marks
and blobs expire on a clock the test can advance), and whose messages are kept in a list.
"""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, TypeVar

from fedqueue.config import Settings
from fedqueue.core import jobs
from fedqueue.core.broker import keys
from fedqueue.core.broker.blobs import blob_ref, checked_blob
from fedqueue.core.broker.ledger import RUN_MARK_FAMILIES, WAKE_KEEP_S, Family, LedgerReads, request_ttl_s
from fedqueue.core.codec import BlobRef
from fedqueue.core.services import Services, WorkerSlots, no_workers_known
from fedqueue.store import Store

T = TypeVar("T")
Clock = Callable[[], float]


class ManualClock:
    """Seconds that pass only when a test says so."""

    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class _Expiring:
    """Values by name that vanish `ttl_s` after they were set, as Redis keys set with EX do."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._items: dict[str, tuple[Any, float | None]] = {}

    def now(self) -> float:
        return self._clock()

    def get(self, name: str) -> Any | None:
        item = self._items.get(name)
        if item is None:
            return None
        value, expires_at = item
        if expires_at is not None and expires_at <= self._clock():
            del self._items[name]
            return None
        return value

    def set(self, name: str, value: Any, ttl_s: float | None, only_new: bool = False) -> bool:
        if only_new and self.get(name) is not None:
            return False
        self._items[name] = (value, None if ttl_s is None else self._clock() + ttl_s)
        return True

    def replace(self, name: str, value: Any) -> None:
        """A new value with the old lifetime (Redis's INCR and DECR); none when it was not there."""
        expires_at = self._items[name][1] if self.get(name) is not None else None
        self._items[name] = (value, expires_at)

    def expire(self, name: str, ttl_s: float) -> None:
        value = self.get(name)
        if value is not None:
            self._items[name] = (value, self._clock() + ttl_s)

    def delete(self, name: str) -> None:
        self._items.pop(name, None)

    def names(self) -> list[str]:
        return [name for name in list(self._items) if self.get(name) is not None]

    def clear(self) -> None:
        self._items.clear()


def _no_queues(queue: str) -> int:
    return 0


class MemoryLedger(LedgerReads):
    """The task ledger in a dict, under the same names as in Redis; expiry runs on `clock`.

    `queue_length` stands for the broker's queues (a `RecordingEnqueuer`'s, in `memory_services`).
    `restart()` is a broker restarted without persistence: every mark forgotten, a new id.
    """

    def __init__(
        self, settings: Settings, clock: Clock = time.time, queue_length: Callable[[str], int] = _no_queues
    ) -> None:
        self.settings = settings
        self._queue_length = queue_length
        self._marks = _Expiring(clock)
        self._changed = threading.Condition()
        self._broker_id = uuid.uuid4().hex

    def restart(self) -> None:
        with self._changed:
            self._marks.clear()
            self._broker_id = uuid.uuid4().hex

    def names(self) -> list[str]:
        """Every name held now (expired ones left out)."""
        with self._changed:
            return sorted(self._marks.names())

    def start_attempt(self, task_key: str, worker: str) -> int:
        attempts = self._key(keys.attempts, task_key)
        with self._changed:
            count = int(self._marks.get(attempts) or 0) + 1
            self._marks.set(attempts, count, self.settings.blob_ttl_s)
            self._marks.set(self._key(keys.running, task_key), worker, self.settings.heartbeat_ttl_s)
        return count

    def take_back_attempt(self, task_key: str) -> None:
        attempts = self._key(keys.attempts, task_key)
        with self._changed:
            count = int(self._marks.get(attempts) or 0) - 1
            if count < 0:
                self._marks.set(attempts, 0, self.settings.blob_ttl_s)
            else:
                self._marks.replace(attempts, count)

    @contextlib.contextmanager
    def heartbeat(self, task_key: str, worker: str) -> Iterator[None]:
        """The running mark does not expire while the block runs; it expires a heartbeat after it."""
        running = self._key(keys.running, task_key)
        with self._changed:
            self._marks.set(running, worker, None)
        try:
            yield
        finally:
            with self._changed:
                self._marks.set(running, worker, self.settings.heartbeat_ttl_s)

    def hold(self, task_key: str, worker: str) -> None:
        with self._changed:
            self._marks.set(self._key(keys.running, task_key), worker, self.settings.heartbeat_ttl_s)

    def count_raised(self, task_key: str) -> int:
        raised = self._key(keys.raised, task_key)
        with self._changed:
            count = int(self._marks.get(raised) or 0) + 1
            self._marks.set(raised, count, self.settings.blob_ttl_s)
        return count

    def _many(self, family: Family, task_keys: Sequence[str]) -> list[Any | None]:
        with self._changed:
            return [self._marks.get(self._key(family, task_key)) for task_key in task_keys]

    def reset_attempts(self, task_key: str) -> None:
        with self._changed:
            self._marks.delete(self._key(keys.attempts, task_key))
            self._marks.delete(self._key(keys.raised, task_key))

    def mark_requeued(self, task_key: str, attempts: int) -> None:
        with self._changed:
            self._marks.set(self._key(keys.requeued, task_key), attempts, self.settings.blob_ttl_s)

    def mark_timed_out(self, task_key: str) -> None:
        limit = self.settings.task_time_limit_s
        with self._changed:
            self._marks.set(self._key(keys.timed_out, task_key), limit, self.settings.blob_ttl_s)

    def stranded_long_enough(self, task_key: str) -> bool:
        key = self._key(keys.stranded, task_key)
        with self._changed:
            now = self._marks.now()
            if self._marks.set(key, now, self.settings.heartbeat_ttl_s * 10, only_new=True):
                return False
            if now - float(self._marks.get(key) or now) < self.settings.heartbeat_ttl_s:
                return False
            self._marks.delete(key)
            return True

    def mark_enqueued(self, group_key: str) -> None:
        with self._changed:
            self._marks.set(self._key(keys.enqueued, group_key), 1, self.settings.blob_ttl_s)

    def request_once(self, task_key: str, within_s: float) -> bool:
        with self._changed:
            return self._marks.set(self._key(keys.requested, task_key), 1, request_ttl_s(within_s), only_new=True)

    def renew_request(self, task_key: str, within_s: float) -> None:
        with self._changed:
            self._marks.expire(self._key(keys.requested, task_key), request_ttl_s(within_s))

    def forget_request(self, task_key: str) -> None:
        with self._changed:
            self._marks.delete(self._key(keys.requested, task_key))

    def forget_run_marks(self, run_id: str) -> None:
        starts = tuple(self._key(family, "") for family in RUN_MARK_FAMILIES)
        with self._changed:
            for name in self._marks.names():
                if name.startswith(starts) and run_id in name:
                    self._marks.delete(name)

    def broker_id(self) -> str:
        return self._broker_id

    def queue_length(self, queue: str) -> int:
        return self._queue_length(queue)

    def put_note(self, key: str, value: str, keep_s: int | None = None) -> None:
        with self._changed:
            self._marks.set(key, value, keep_s or self.settings.blob_ttl_s)

    def note(self, key: str) -> str | None:
        with self._changed:
            value = self._marks.get(key)
        return None if value is None else str(value)

    def drop_note(self, key: str) -> None:
        with self._changed:
            self._marks.delete(key)

    def wake(self, key: str) -> None:
        with self._changed:
            self._marks.set(key, int(self._marks.get(key) or 0) + 1, WAKE_KEEP_S)
            self._changed.notify_all()

    def wait_for_wake(self, key: str, timeout_s: float) -> bool:
        """Waits in real time (not on the clock): a wake-up comes from another thread, or is there already."""
        with self._changed:
            if not self._changed.wait_for(lambda: self._marks.get(key) is not None, timeout=timeout_s):
                return False
            self._marks.delete(key)
            return True

    def close(self) -> None:
        pass


class MemoryBlobStore:
    """Blobs in a dict, checked against their sha256 on every read as the real stores do; they expire
    `ttl_s` after they were put (never when None)."""

    def __init__(self, ttl_s: float | None = None, clock: Clock = time.time) -> None:
        self._ttl_s = ttl_s
        self._blobs = _Expiring(clock)
        self._lock = threading.Lock()

    def put(self, key: str, data: bytes) -> BlobRef:
        with self._lock:
            self._blobs.set(key, bytes(data), self._ttl_s)
        return blob_ref(key, data)

    def put_many(self, items: Sequence[tuple[str, bytes]]) -> list[BlobRef]:
        return [self.put(key, data) for key, data in items]

    def get(self, ref: BlobRef) -> bytes:
        with self._lock:
            data = self._blobs.get(ref.key)
        return checked_blob(ref, data)

    def get_many(self, refs: Sequence[BlobRef]) -> list[bytes]:
        return [self.get(ref) for ref in refs]

    def delete(self, keys: Iterable[str]) -> None:
        with self._lock:
            for key in keys:
                self._blobs.delete(key)

    def exists(self, key: str) -> bool:
        with self._lock:
            return self._blobs.get(key) is not None

    def names(self) -> list[str]:
        """Every blob's key held now (expired ones left out)."""
        with self._lock:
            return sorted(self._blobs.names())

    def clear(self) -> None:
        """Every blob gone (a broker that kept them restarted without persistence)."""
        with self._lock:
            self._blobs.clear()


class RecordingEnqueuer:
    """An `Enqueue` that delivers nothing: `sent` keeps every message it was given, in order, and
    `waiting` those no test took yet (the queues, each message on its handler's)."""

    def __init__(self) -> None:
        self.sent: list[Any] = []
        self.waiting: list[Any] = []

    def __call__(self, messages: Sequence[Any]) -> None:
        self.sent.extend(messages)
        self.waiting.extend(messages)

    def of_type(self, message_type: type[T]) -> list[T]:
        """Every message of this type sent so far."""
        return [message for message in self.sent if isinstance(message, message_type)]

    def take(self) -> list[Any]:
        """The waiting messages, off their queues (as workers take them)."""
        taken, self.waiting = self.waiting, []
        return taken

    def queue_length(self, queue: str) -> int:
        """Messages waiting on a queue (by suffix)."""
        return sum(1 for message in self.waiting if jobs.handler_for(message).queue == queue)


def memory_services(
    settings: Settings, store: Store, clock: Clock = time.time, worker_slots: WorkerSlots = no_workers_known
) -> Services:
    """Services over `store` with an in-memory ledger and blob store (expiring on `clock`) and a recording
    enqueuer, whose waiting messages are the ledger's queues."""
    enqueue = RecordingEnqueuer()
    return Services(
        settings=settings,
        store=store,
        blobs=MemoryBlobStore(settings.blob_ttl_s, clock),
        ledger=MemoryLedger(settings, clock, enqueue.queue_length),
        enqueue=enqueue,
        worker_slots=worker_slots,
    )
