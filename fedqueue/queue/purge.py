"""Dropping a cancelled run's messages from the queues, where Celery keeps them on the broker's Redis.

Each queue is a Redis list of Celery's JSON envelopes; a task's message is the first argument in the
envelope's body. A message is removed by its exact bytes (LREM), so one a worker takes meanwhile is
simply not found: the worker skips it instead (fedqueue.queue.tasks). Messages already delivered to a
worker (Celery's unacked hash) are left to it, and skipped the same way.
"""

from __future__ import annotations

import base64
import json
import logging
from typing import Any

import redis

from fedqueue.config import Settings
from fedqueue.core import jobs
from fedqueue.core.broker import keys

log = logging.getLogger(__name__)

# kombu keeps a message sent with a priority in a list of its own beside the queue's: NAME + SEP + priority.
PRIORITY_SEP = "\x06\x16"
PRIORITY_STEPS = (3, 6, 9)
READ_AT_ONCE = 1000


def queue_lists(settings: Settings) -> list[str]:
    """The Redis lists of every installed kind's queues and of the control queue."""
    suffixes = {jobs.CONTROL_QUEUE}
    for kind in jobs.kinds().values():
        suffixes.update(kind.queues)
    names = [keys.queue_list(settings.key_prefix, settings.queue(suffix)) for suffix in sorted(suffixes)]
    return [*names, *(f"{name}{PRIORITY_SEP}{step}" for name in names for step in PRIORITY_STEPS)]


def message_run(raw: bytes | str) -> str | None:
    """The run id in one queued Celery message (as read from Redis, decoded or not); None for one that is not
    fedqueue's (or not readable)."""
    try:
        envelope = json.loads(raw)
        body = envelope["body"]
        if envelope.get("properties", {}).get("body_encoding") == "base64":
            body = base64.b64decode(body)
        args = json.loads(body)[0]
        run_id = args[0].get("run_id") if args and isinstance(args[0], dict) else None
    except (ValueError, KeyError, TypeError, IndexError, AttributeError):
        return None
    return run_id if isinstance(run_id, str) else None


def drop_queued(client: redis.Redis, settings: Settings, run_id: str) -> int:
    """Remove the run's messages waiting on its broker's queues; how many were removed."""
    dropped = 0
    for name in queue_lists(settings):
        start = 0
        while True:
            chunk: list[Any] = client.lrange(name, start, start + READ_AT_ONCE - 1)  # bytes: no decoding client
            if not chunk:
                break
            ours = [raw for raw in chunk if message_run(raw) == run_id]
            for raw in ours:
                dropped += int(client.lrem(name, 1, raw))
            start += len(chunk) - len(ours)  # the list shrank by what was removed
    if dropped:
        log.info("run %s: %d queued tasks dropped", run_id, dropped)
    return dropped
