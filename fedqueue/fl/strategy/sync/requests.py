"""Requests for scheduler steps, made by whoever finds one due: a worker that stored a result, or a repair pass.

Kept apart from the round machinery (fedqueue.fl.strategy.sync.rounds) so that the worker side asks for an
aggregation without importing the code that runs it.
"""

from __future__ import annotations

import time

from fedqueue.core.services import Services
from fedqueue.fl.messages import AggregateTask


def request_aggregation(services: Services, run_id: str, round_index: int) -> bool:
    """Enqueue the round's aggregation task, unless it was requested within the last two claim periods."""
    task = AggregateTask(run_id=run_id, round_index=round_index, enqueued_at=time.time())
    if not services.ledger.request_once(task.attempt_key, within_s=2 * services.settings.heartbeat_ttl_s):
        return False
    services.enqueue([task])
    return True
