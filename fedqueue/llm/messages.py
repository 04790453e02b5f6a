"""The LLM job kind's task message: one batch of prompts to generate. JSON-only, checked on decode."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from fedqueue.core.codec import INT_LIMIT, MessageError, require_fields

KIND_NAME = "llm"  # the job kind, as runs and task timings name it
LLM_QUEUE = "llm"  # the queue suffix LLM batches travel on, apart from FL's device tasks
KEY_MAX = 300  # longest prompt key (the store's column)
BATCH_MAX = 100_000  # most prompts one message may carry


@dataclass(frozen=True)
class GenerateBatch:
    """Generate the prompts with these keys (those still pending) of one job, as one batch."""

    run_id: str
    batch: int
    keys: tuple[str, ...]
    enqueued_at: float

    def to_dict(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "batch": self.batch, "keys": list(self.keys), "enqueued_at": self.enqueued_at}

    @classmethod
    def from_dict(cls, raw: Any) -> GenerateBatch:
        require_fields(raw, {"run_id": str, "batch": int, "keys": list, "enqueued_at": (int, float)}, "batch")
        if not 0 <= raw["batch"] < INT_LIMIT:
            raise MessageError("batch.batch: out of range")
        keys = raw["keys"]
        if not 1 <= len(keys) <= BATCH_MAX:
            raise MessageError(f"batch.keys: expected 1 to {BATCH_MAX} keys, got {len(keys)}")
        if not all(isinstance(key, str) and 0 < len(key) <= KEY_MAX for key in keys):
            raise MessageError(f"batch.keys: every key must be a string of 1 to {KEY_MAX} characters")
        if not math.isfinite(raw["enqueued_at"]):
            raise MessageError("batch.enqueued_at: must be a finite number")
        return cls(run_id=raw["run_id"], batch=raw["batch"], keys=tuple(keys), enqueued_at=float(raw["enqueued_at"]))

    @property
    def attempt_key(self) -> str:
        return f"llm:{self.run_id}:{self.batch}"

    @property
    def label(self) -> str:
        """What Flower's task list shows."""
        return f"job {self.run_id} batch {self.batch} ({len(self.keys)} prompts)"

    @property
    def task_name(self) -> str:
        """Its name in the job's task timings."""
        return batch_task_name(self.batch)


def batch_task_name(batch: int) -> str:
    return f"batch {batch}"
