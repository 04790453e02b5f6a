"""A wake-up for whoever follows a job: workers push to a Redis list after storing a batch.

The follower blocks on the list instead of sleeping between polls of the store, so it sees the
job's end (and each batch) as soon as it is stored. The list only wakes; the store stays the truth.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import redis

from fedqueue.core import keys

log = logging.getLogger(__name__)

KEEP_S = 3600  # a list nobody follows goes away on its own


def announce_stored(client: redis.Redis, key_prefix: str, run_id: str) -> None:
    """Wake the job's follower; a failure only delays it until its next poll, so it is logged, not raised."""
    key = keys.llm_stored(key_prefix, run_id)
    try:
        with client.pipeline() as pipe:
            pipe.rpush(key, 1)
            pipe.expire(key, KEEP_S)
            pipe.execute()
    except redis.RedisError as err:
        log.warning("job %s: follower not woken (%s); it polls instead", run_id, err)


def stored_waiter(client: redis.Redis, key_prefix: str, run_id: str) -> Callable[[float], None]:
    """A wait of at most `timeout_s` that returns as soon as a batch of the job is stored."""
    key = keys.llm_stored(key_prefix, run_id)

    def wait(timeout_s: float) -> None:
        if client.blpop([key], timeout=timeout_s):
            client.delete(key)  # one wake-up for every batch stored meanwhile: the store is read next

    return wait
