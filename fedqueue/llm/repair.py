"""Bring an LLM job's queue back in line with its store: the job kind's repair pass.

Run every few seconds by whoever holds the job's lease. Batches whose prompts are still
pending, and that neither run nor wait on the queue, are enqueued again (their worker died,
or Redis restarted); a batch that used up its attempts stores its prompts failed.
"""

from __future__ import annotations

import time
from collections import defaultdict

from fedqueue.core.runs.lost import find_lost
from fedqueue.core.services import Services
from fedqueue.llm.messages import LLM_QUEUE, GenerateBatch
from fedqueue.llm.results import job_counts, pending_prompts
from fedqueue.llm.worker import fail_batch


def reconcile(services: Services, run_id: str) -> list[str]:
    """One repair pass; returns what it did, one line per action (empty when all is well)."""
    run = services.store.get_run(run_id)
    if run.state != "running":
        return []
    actions: list[str] = []
    broker_id = services.ledger.broker_id()
    broker_lost = run.broker_id is not None and run.broker_id != broker_id
    if broker_lost:
        actions.append("broker restarted (its run_id changed): enqueueing pending batches again")
    if job_counts(services.store, run_id).get("pending", 0) == 0:
        if services.store.finish_run(run_id, "finished"):
            actions.append("every prompt was stored but the job not finished: finished")
        return actions
    tasks = [GenerateBatch(run_id, batch, keys, time.time()) for batch, keys in _pending_batches(services, run_id)]

    def unstored_now() -> set[str]:
        still = {batch for batch, _ in _pending_batches(services, run_id)}
        return {task.attempt_key for task in tasks if task.batch in still}

    found = find_lost(services, tasks, LLM_QUEUE, unstored_now, requeue_unstarted=broker_lost)
    for task, tries, reason in found.exhausted:
        fail_batch(services, task, "scheduler", tries, reason)
        actions.append(f"batch {task.batch} failed after {tries} attempts")
    if found.requeue:
        services.enqueue(found.requeue)
        actions.append(f"enqueued again {len(found.requeue)} batches: {', '.join(str(t.batch) for t in found.requeue)}")
    if run.broker_id != broker_id:
        services.store.set_broker_id(run_id, broker_id)
    return actions


def _pending_batches(services: Services, run_id: str) -> list[tuple[int, tuple[str, ...]]]:
    """Planned batches with prompts still pending, and those prompts' keys."""
    keys: dict[int, list[str]] = defaultdict(list)
    for row in pending_prompts(services.store, run_id):
        if row.batch is not None:
            keys[row.batch].append(row.key)
    return [(batch, tuple(found)) for batch, found in sorted(keys.items())]


__all__ = ["reconcile"]
