"""FedBuff's control task: a fold pass, as the kind registers it."""

from __future__ import annotations

from fedqueue.core.jobs import CONTROL_QUEUE, TaskContext, TaskHandler
from fedqueue.fl.messages import FoldTask
from fedqueue.fl.strategy.fedbuff.fold import fold_updates

FOLD_UPDATES = "fedqueue.fold_updates"


def _fold(context: TaskContext, task: FoldTask) -> None:
    fold_updates(context.services, context.cache, task.run_id, context.worker, context.attempt)
    # A run's fold passes share one attempt key: a pass that went through clears the failures before it.
    context.services.ledger.reset_attempts(task.attempt_key)


def _fold_failed(context: TaskContext, task: FoldTask, attempts: int, error: str) -> None:
    reason = error.strip().splitlines()[-1:] or ["unknown error"]
    if context.services.store.finish_run(task.run_id, "failed", f"fold pass failed {attempts} times: {reason[0]}"):
        context.services.ledger.reset_attempts(task.attempt_key)


FOLD = TaskHandler(FOLD_UPDATES, CONTROL_QUEUE, FoldTask, _fold, _fold_failed)
