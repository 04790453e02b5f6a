"""A failed run tried again: set running, its tasks' attempt counts forgotten, its kind's stored failures cleared.

A run fails for good when a step used up its attempts: an aggregation or a fold pass whose workers were
killed again and again, a device under `on_failure = "abort"`. What it had stored (rounds, versions,
results) stays: the repair pass of whoever follows it next takes the run on from there.
"""

from __future__ import annotations

from fedqueue.core import jobs
from fedqueue.core.services import Services
from fedqueue.errors import ConfigError


def retry_failed_run(services: Services, run_id: str) -> list[str]:
    """Make a failed run running again; returns what was cleared, one line per action."""
    run = services.store.get_run(run_id)
    if run.state != "failed":
        raise ConfigError(f"run {run_id} is {run.state}: only a failed run can be tried again")
    actions = jobs.get(run.kind).retry_failed(services, run_id)
    services.ledger.forget_run_marks(run_id)
    services.store.reopen_run(run_id)
    return [f"run {run_id} failed ({first_line(run.error)}); trying again from its last stored state", *actions]


def first_line(error: str | None) -> str:
    lines = (error or "").strip().splitlines()
    return lines[0] if lines else "no reason stored"
