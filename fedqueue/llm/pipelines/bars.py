"""What a follower shows of a pipeline: one bar of items ended, with the calls made so far."""

from __future__ import annotations

from fedqueue.core.jobs import ProgressBar
from fedqueue.core.services import Services
from fedqueue.llm.pipelines.rows import pipeline_counts
from fedqueue.llm.wake import stored_waiter


class ItemProgress:
    """`wait` returns early when a lane stores a batch, so the pipeline's end is seen at once."""

    def __init__(self, services: Services, run_id: str) -> None:
        self.store = services.store
        self.run_id = run_id
        self.wait = stored_waiter(services, run_id)

    def bars(self) -> list[ProgressBar]:
        counts = pipeline_counts(self.store, self.run_id)
        note = f"{counts.get('calls', 0)} calls" + (f" · {counts['failed']} failed" if counts.get("failed") else "")
        ended = counts.get("done", 0) + counts.get("failed", 0)
        return [ProgressBar("items", "items", ended, counts.get("total", 0), note=note)]
