"""Bring a pipeline's lanes back in line with its store: the LLM kind's repair pass for a pipeline run.

A lane whose task neither runs nor waits on the queue (its worker died, or Redis forgot the queue) has that
task enqueued again; run again, it takes the calls the lane had claimed, so nothing stored is generated twice.
A task that used up its attempts fails the items whose calls it held, and the lane goes on.
"""

from __future__ import annotations

import time

from fedqueue.core.runs.lost import find_lost
from fedqueue.core.services import Services
from fedqueue.llm.messages import LLM_QUEUE
from fedqueue.llm.pipelines.lane import give_up_lane
from fedqueue.llm.pipelines.messages import PipelineLane
from fedqueue.llm.pipelines.rows import lanes, pipeline_counts


def reconcile_pipeline(services: Services, run_id: str) -> list[str]:
    """One repair pass; one line per action (empty when all is well)."""
    run = services.store.get_run(run_id)
    if run.state != "running":
        return []
    actions: list[str] = []
    broker_id = services.ledger.broker_id()
    broker_lost = run.broker_id is not None and run.broker_id != broker_id
    if broker_lost:
        actions.append("broker restarted (its run_id changed): enqueueing every lane's task again")
    if pipeline_counts(services.store, run_id).get("running", 0) == 0:
        if services.store.finish_run(run_id, "finished"):
            actions.append("every item was stored but the pipeline not finished: finished")
        return actions
    now = time.time()
    tasks = [PipelineLane(run_id, lane, seq, now) for lane, seq in lanes(services.store, run_id)]

    def unstored_now() -> set[str]:
        current = set(lanes(services.store, run_id))
        return {task.attempt_key for task in tasks if (task.lane, task.seq) in current}

    found = find_lost(services, tasks, LLM_QUEUE, unstored_now, requeue_unstarted=broker_lost)
    for task, tries, reason in found.exhausted:
        give_up_lane(services, task, reason)
        actions.append(f"lane {task.lane} task {task.seq} failed after {tries} attempts")
    if found.requeue:
        services.enqueue(found.requeue)
        actions.append(f"enqueued again the tasks of lanes {', '.join(str(task.lane) for task in found.requeue)}")
    if run.broker_id != broker_id:
        services.store.set_broker_id(run_id, broker_id)
    return actions
