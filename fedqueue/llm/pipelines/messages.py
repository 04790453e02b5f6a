"""A pipeline's task message: lane `lane` of a run, at its task number `seq`, takes a batch of pending calls.

JSON-only, checked on decode. Each stored batch moves the lane to seq + 1 and sends that task, so a lane is a
chain of short tasks, never one long one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from fedqueue.core.codec import INT_LIMIT, MessageError, require_fields

LANES_MAX = 4096


@dataclass(frozen=True)
class PipelineLane:
    run_id: str
    lane: int
    seq: int
    enqueued_at: float

    def to_dict(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "lane": self.lane, "seq": self.seq, "enqueued_at": self.enqueued_at}

    @classmethod
    def from_dict(cls, raw: Any) -> PipelineLane:
        require_fields(raw, {"run_id": str, "lane": int, "seq": int, "enqueued_at": (int, float)}, "lane")
        if not 0 <= raw["lane"] < LANES_MAX:
            raise MessageError(f"lane.lane: expected 0 to {LANES_MAX - 1}")
        if not 0 <= raw["seq"] < INT_LIMIT:
            raise MessageError("lane.seq: out of range")
        if not math.isfinite(raw["enqueued_at"]):
            raise MessageError("lane.enqueued_at: must be a finite number")
        return cls(raw["run_id"], raw["lane"], raw["seq"], float(raw["enqueued_at"]))

    def next(self, now: float) -> PipelineLane:
        return PipelineLane(self.run_id, self.lane, self.seq + 1, now)

    @property
    def attempt_key(self) -> str:
        return f"llm-pipe:{self.run_id}:{self.lane}:{self.seq}"

    @property
    def label(self) -> str:
        return f"pipeline {self.run_id} lane {self.lane} task {self.seq}"

    @property
    def task_name(self) -> str:
        return f"lane {self.lane}"
