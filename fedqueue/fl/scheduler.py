"""The scheduler's two ways into a run: submitting it, and the repair pass that keeps its queue in line with its store.

Both pick the run's strategy (fedqueue.fl.strategy.registry) and leave the rest to it. The repair pass
runs every few seconds in whoever holds the run's lease: the process that follows it (`fedqueue run`,
`fedqueue resume`), or else a `fedqueue worker` launcher that adopted it.
"""

from __future__ import annotations

import uuid

from fedqueue.core.services import Services
from fedqueue.core.waits.outage import run_stored
from fedqueue.fl.config import RunConfig
from fedqueue.fl.messages import KIND_NAME
from fedqueue.fl.strategy.common import checkpoint_version
from fedqueue.fl.strategy.registry import strategy_for


def new_run_id() -> str:
    return uuid.uuid4().hex[:12]


def submit_run(services: Services, config: RunConfig, run_id: str | None = None, apart: bool = False) -> str:
    """Record the run, publish version 0 of the model and enqueue its first work. `apart`: its torch work done by a
    running worker, else in a process of its own (fl/submit/prepare.py), so this one never loads torch."""
    from fedqueue.fl.submit.memory import check_fits
    from fedqueue.fl.submit.prepare import prepare, prepare_apart, prepare_on_worker

    run_id = run_id or new_run_id()
    # The workers are asked (a second or so) only where the packing is "auto"; the memory check reads them then.
    workers = services.worker_slots() if config.packing.needs_workers else None
    check_fits(config, workers)
    if apart:
        on_worker = prepare_on_worker(services.ask_workers, config, lambda: workers or {})
        prepared = on_worker or prepare_apart(config, lambda: workers or {})
    else:
        prepared = prepare(config, lambda: workers or {})
    config, encoded = prepared.config, prepared.state
    services.store.create_run(
        run_id,
        config.name,
        config.to_dict(),
        strategy_for(config).rounds_total(config),
        kind=KIND_NAME,
        broker_id=services.ledger.broker_id(),
    )
    with run_stored(run_id):  # the broker failing from here leaves the run for its repair pass to start
        checkpoint_version(services, run_id, 0, encoded)
        strategy_for(config).start(services, run_id, config, encoded)
    return run_id


def reconcile(services: Services, run_id: str) -> list[str]:
    """One repair pass; returns what it did, one line per action (empty when all is well)."""
    run = services.store.get_run(run_id)
    if run.state != "running":
        return []
    config = RunConfig.from_stored(run.config)
    actions: list[str] = []
    # Redis's own run_id changes when it restarts; without persistence its queue and blobs are gone.
    broker_id = services.ledger.broker_id()
    broker_lost = run.broker_id is not None and run.broker_id != broker_id
    if broker_lost:
        actions.append("broker restarted (its run_id changed): checking the current round")
    actions += strategy_for(config).repair(services, run_id, config, broker_lost)
    if run.broker_id != broker_id:
        services.store.set_broker_id(run_id, broker_id)
    return actions
