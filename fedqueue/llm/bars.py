"""What a follower shows of an LLM job: one bar of prompts stored, with generated tokens per second."""

from __future__ import annotations

import time

from fedqueue.core.jobs import ProgressBar
from fedqueue.core.services import Services
from fedqueue.llm.results import job_counts
from fedqueue.llm.wake import stored_waiter


class PromptProgress:
    """The rate counts tokens generated since following began. `wait` returns early when a batch is
    stored (see fedqueue.llm.wake), so the job's end is seen at once."""

    def __init__(self, services: Services, run_id: str) -> None:
        self.store = services.store
        self.run_id = run_id
        self.wait = stored_waiter(services, run_id)
        self.started = time.monotonic()
        self.first_tokens: int | None = None

    def bars(self) -> list[ProgressBar]:
        counts = job_counts(self.store, self.run_id)
        tokens = counts.get("generated_tokens", 0)
        if self.first_tokens is None:
            self.first_tokens = tokens
        elapsed = time.monotonic() - self.started
        rate = (tokens - self.first_tokens) / elapsed if elapsed > 0 else 0.0
        note = f"{rate:,.0f} tokens/s" + (f" · {counts['failed']} failed" if counts.get("failed") else "")
        stored = counts.get("done", 0) + counts.get("failed", 0)
        return [ProgressBar("prompts", "prompts", stored, counts.get("total", 0), note=note)]
