"""Whether this worker process was asked to stop: a wait for the broker or store gives up at once then."""

from __future__ import annotations

from celery.worker import state as worker_state


def worker_stopping() -> bool:
    """SIGTERM, or the launcher gone. Celery's flags hold the exit code once set, and a warm stop's is 0:
    set means "not None, not False"."""
    return any(
        flag is not None and flag is not False for flag in (worker_state.should_stop, worker_state.should_terminate)
    )
