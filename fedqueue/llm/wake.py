"""A wake-up for whoever follows a job: workers send one through the task ledger after storing a batch.

The follower blocks on it instead of sleeping between polls of the store, so it sees the job's
end (and each batch) as soon as it is stored. The wake-up only wakes; the store stays the truth.
A wake-up that cannot be sent only delays the follower until its next poll.
"""

from __future__ import annotations

from collections.abc import Callable

from fedqueue.core.services import Services


def stored_key(prefix: str, run_id: str) -> str:
    """The list that wakes the job's follower (a Redis key: running clusters hold it, so it never changes)."""
    return f"{prefix}:llm-stored:{run_id}"


def announce_stored(services: Services, run_id: str) -> None:
    """Wake the job's follower."""
    services.ledger.wake(stored_key(services.settings.key_prefix, run_id))


def stored_waiter(services: Services, run_id: str) -> Callable[[float], None]:
    """A wait of at most `timeout_s` that returns as soon as a batch of the job is stored."""
    key = stored_key(services.settings.key_prefix, run_id)

    def wait(timeout_s: float) -> None:
        services.ledger.wait_for_wake(key, timeout_s)  # every batch stored meanwhile: the store is read next

    return wait
