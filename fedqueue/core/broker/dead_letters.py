"""Dead letters: messages a worker refused for good, kept where `fedqueue status` shows them.

A message that is not a task envelope, a malformed or forged task, a task whose signature is wrong or whose run
the store does not know: each is refused once, never put back, and recorded here as a small JSON record (when,
queue, why, the start of its body) on one bounded Redis list per deployment.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict, dataclass
from typing import Any

import redis

from fedqueue.core.broker import keys

log = logging.getLogger(__name__)

KEPT = 1000  # records the list keeps, newest first: a flood of poison cannot fill Redis
BODY_CHARS = 300  # of each message's body


@dataclass(frozen=True)
class DeadLetter:
    at: float  # epoch seconds
    queue: str
    why: str
    body: str  # its first BODY_CHARS characters, as text (bytes that are not UTF-8 shown escaped)


def body_text(body: Any) -> str:
    """The start of a message body, whatever it is, as short text."""
    if isinstance(body, bytes | bytearray | memoryview):
        text = bytes(body[: BODY_CHARS * 4]).decode("utf-8", errors="backslashreplace")
    elif isinstance(body, str):
        text = body[:BODY_CHARS]
    else:
        try:
            text = json.dumps(body, default=repr)[: BODY_CHARS + 1]
        except (TypeError, ValueError, RecursionError):
            text = repr(body)[:BODY_CHARS]
    return text if len(text) <= BODY_CHARS else f"{text[:BODY_CHARS]}..."


def dead_letter(client: redis.Redis, prefix: str, queue: str, why: str, body: Any) -> None:
    """Record a refused message; logged, and never raised: a broker that fails here must not stop the worker."""
    record = DeadLetter(at=time.time(), queue=queue, why=why[:500], body=body_text(body))
    log.error("dead-lettered a message from %s: %s", queue, record.why)
    try:
        with client.pipeline(transaction=True) as pipe:
            pipe.lpush(keys.dead_letters(prefix), json.dumps(asdict(record)))
            pipe.ltrim(keys.dead_letters(prefix), 0, KEPT - 1)
            pipe.incr(keys.dead_letter_count(prefix))
            pipe.execute()
    except redis.RedisError as err:
        log.warning("the dead letter was not recorded (%s)", err)


def recent_dead_letters(client: redis.Redis, prefix: str, last: int = 5) -> tuple[int, list[DeadLetter]]:
    """How many messages were dead-lettered in all, and the latest `last`, newest first: read in one transaction,
    so a message dead-lettered meanwhile is in both or in neither."""
    with client.pipeline(transaction=True) as pipe:
        pipe.get(keys.dead_letter_count(prefix))
        pipe.lrange(keys.dead_letters(prefix), 0, last - 1)
        stored, latest = pipe.execute()
    count = int(stored or 0)
    records = []
    for raw in latest:
        try:
            records.append(DeadLetter(**json.loads(raw)))
        except (TypeError, ValueError):  # written by someone else: shown as it is
            records.append(DeadLetter(at=0.0, queue="?", why="unreadable record", body=body_text(raw)))
    return count, records
