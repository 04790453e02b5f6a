"""The fold pass as a control task, for a version rule (FedBuff's, FedRevive's, FedAsync's): the kind registers it
once, and the registry hands each message to the handler of its run's strategy."""

from __future__ import annotations

from fedqueue.core.jobs import CONTROL_QUEUE, TaskContext, TaskHandler
from fedqueue.fl.messages import FoldTask
from fedqueue.fl.strategy.fedbuff.fold import fold_updates
from fedqueue.fl.strategy.fedbuff.rule import BUFFERED, VersionRule

FOLD_UPDATES = "fedqueue.fold_updates"


def _fold_failed(context: TaskContext, task: FoldTask, attempts: int, error: str) -> None:
    reason = error.strip().splitlines()[-1:] or ["unknown error"]
    if context.services.store.finish_run(task.run_id, "failed", f"fold pass failed {attempts} times: {reason[0]}"):
        context.services.ledger.reset_attempts(task.attempt_key)


def fold_handler(rule: VersionRule) -> TaskHandler:
    """The fold task of the runs whose versions `rule` makes."""

    def fold(context: TaskContext, task: FoldTask) -> None:
        fold_updates(context.services, context.cache, task.run_id, context.worker, context.attempt, rule)
        # A run's fold passes share one attempt key: a pass that went through clears the failures before it.
        context.services.ledger.reset_attempts(task.attempt_key)

    return TaskHandler(FOLD_UPDATES, CONTROL_QUEUE, FoldTask, fold, _fold_failed)


FOLD = fold_handler(BUFFERED)
