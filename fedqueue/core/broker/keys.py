"""The Redis keys of the core and of Celery, by family, and where blobs live in Redis.

Each family is a function of the key prefix (`Settings.key_prefix`) and its ids. Running clusters
hold these strings, so they never change: a new family gets a new function here, an old one keeps
its string. A job kind names its own keys and blobs beside its code (fedqueue.fl.messages,
fedqueue.fl.strategy.fedbuff.fold, fedqueue.llm.wake), under the same prefix.
"""

from __future__ import annotations

# --- Celery's own keys (queues, the unacked hash, its bookkeeping): all under this, as its global_keyprefix.


def celery_prefix(prefix: str) -> str:
    return f"{prefix}:"


def queue_list(prefix: str, queue: str) -> str:
    """A queue's list of waiting messages (Celery writes it; `queue` is a full name, `Settings.queue(suffix)`)."""
    return f"{celery_prefix(prefix)}{queue}"


def unacked(prefix: str) -> str:
    """Messages delivered to a worker and not yet acknowledged (Celery's hash; a worker lost returns them)."""
    return f"{celery_prefix(prefix)}unacked"


# --- A task's marks, named by its attempt key (`<prefix>:<family>:<attempt_key>`): the task ledger's.


def _task_mark(prefix: str, family: str, task_key: str) -> str:
    return f"{prefix}:{family}:{task_key}"


def attempts(prefix: str, task_key: str) -> str:
    """How many deliveries of the task started: counted by the worker taking each (kept blob_ttl_s)."""
    return _task_mark(prefix, "attempts", task_key)


def raised(prefix: str, task_key: str) -> str:
    """How many of the task's attempts ended in an error its own code raised (or the time limit): counted by the
    worker; the rest of its attempts, bar one running, were lost with their worker (kept blob_ttl_s)."""
    return _task_mark(prefix, "raised", task_key)


def running(prefix: str, task_key: str) -> str:
    """The worker running the task: set as it starts, refreshed by its heartbeat, expires heartbeat_ttl_s after."""
    return _task_mark(prefix, "running", task_key)


def requeued(prefix: str, task_key: str) -> str:
    """The attempt count at which a repair pass last enqueued the task again (written by that pass)."""
    return _task_mark(prefix, "requeued", task_key)


def timed_out(prefix: str, task_key: str) -> str:
    """The time limit a delivery of the task ran past (its worker's watchdog writes it before the worker ends)."""
    return _task_mark(prefix, "timeout", task_key)


def stranded(prefix: str, task_key: str) -> str:
    """When a repair pass first saw the task neither queued, running nor done (that pass writes and clears it)."""
    return _task_mark(prefix, "stranded", task_key)


def enqueued(prefix: str, group_key: str) -> str:
    """Every task of a group (a round) is on the queue: written by its starter after the last one was sent."""
    return _task_mark(prefix, "enqueued", group_key)


def requested(prefix: str, task_key: str) -> str:
    """A request of the task (an aggregation, a fold pass) made and not yet taken up: set by the requester."""
    return _task_mark(prefix, "requested", task_key)


# --- What a run waits for.


def waiting(prefix: str, run_id: str) -> str:
    """What a run's workers wait for (an outage of the broker or store), written by a worker that met it; short-lived."""
    return f"{prefix}:waiting:{run_id}"


# --- Messages refused for good.


def dead_letters(prefix: str) -> str:
    """Messages refused for good (not an envelope, malformed, forged, of an unknown run), newest first: a bounded
    list of small JSON records, pushed by the worker that refused each (fedqueue.core.broker.dead_letters)."""
    return f"{prefix}:dead-letters"


def dead_letter_count(prefix: str) -> str:
    """How many messages were ever dead-lettered (the list keeps only the latest)."""
    return f"{prefix}:dead-letters:count"


# --- Worker processes.


def ready(prefix: str, token: str) -> str:
    """A launcher's list of worker names that announced themselves ready (workers push, the launcher pops)."""
    return f"{prefix}:ready:{token}"


def queue_readers(prefix: str, queue: str) -> str:
    """The worker processes reading a queue (a full name): a sorted set of hostnames, each scored by when its mark
    runs out (the broker's clock), refreshed by the worker (fedqueue.core.broker.readers)."""
    return f"{prefix}:readers:{queue}"


# --- Blobs: a blob named `name` lives in Redis under blob_prefix(prefix) + name, or in a blob folder at `name`.


def blob_prefix(prefix: str) -> str:
    """Where blob store strings live in Redis (written by whoever puts a blob, kept blob_ttl_s)."""
    return f"{prefix}:blob:"
