"""The FL job kind's task messages: small, frozen, JSON-only. Each owns its encoding and its checks."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from fedqueue.core.codec import INT_LIMIT, BlobRef, MessageError, require_fields

KIND_NAME = "fl"  # the job kind these messages belong to, as runs and task timings name it
DEVICES_QUEUE = "devices"  # the queue (a suffix of the prefixed name) device tasks travel on


@dataclass(frozen=True)
class DeviceTask:
    """Train one simulated device for one round, starting from a global model version."""

    run_id: str
    round_index: int
    device: int
    model: BlobRef
    enqueued_at: float
    round_size: int  # devices selected in the round: the worker storing the last result closes it

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, raw: Any) -> DeviceTask:
        require_fields(
            raw,
            {
                "run_id": str,
                "round_index": int,
                "device": int,
                "model": dict,
                "enqueued_at": (int, float),
                "round_size": int,
            },
            "task",
        )
        if not 1 <= raw["round_index"] < INT_LIMIT:
            raise MessageError("task.round_index: out of range")
        if not 0 <= raw["device"] < INT_LIMIT:
            raise MessageError("task.device: out of range")
        if not math.isfinite(raw["enqueued_at"]):
            raise MessageError("task.enqueued_at: must be a finite number")
        if not 1 <= raw["round_size"] < INT_LIMIT:
            raise MessageError("task.round_size: out of range")
        return cls(
            run_id=raw["run_id"],
            round_index=raw["round_index"],
            device=raw["device"],
            model=BlobRef.from_dict(raw["model"]),
            enqueued_at=float(raw["enqueued_at"]),
            round_size=raw["round_size"],
        )

    @property
    def attempt_key(self) -> str:
        return f"{self.run_id}:{self.round_index}:{self.device}"

    @property
    def label(self) -> str:
        return f"run {self.run_id} round {self.round_index} device {self.device}"

    @property
    def task_name(self) -> str:
        """Its name in the run's task timings."""
        return device_task_name(self.round_index, self.device)


@dataclass(frozen=True)
class AggregateTask:
    """Aggregate a round whose results are all stored, evaluate, and start the next round."""

    run_id: str
    round_index: int
    enqueued_at: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, raw: Any) -> AggregateTask:
        require_fields(raw, {"run_id": str, "round_index": int, "enqueued_at": (int, float)}, "aggregate")
        if not 1 <= raw["round_index"] < INT_LIMIT:
            raise MessageError("aggregate.round_index: out of range")
        if not math.isfinite(raw["enqueued_at"]):
            raise MessageError("aggregate.enqueued_at: must be a finite number")
        return cls(run_id=raw["run_id"], round_index=raw["round_index"], enqueued_at=float(raw["enqueued_at"]))

    @property
    def attempt_key(self) -> str:
        return aggregate_key(self.run_id, self.round_index)

    @property
    def label(self) -> str:
        return f"run {self.run_id} round {self.round_index} aggregation"

    @property
    def task_name(self) -> str:
        return f"round {self.round_index} aggregation"


def aggregate_key(run_id: str, round_index: int) -> str:
    """The key that counts a round's aggregation attempts and marks it requested."""
    return f"aggregate:{run_id}:{round_index}"


def device_task_name(round_index: int, device: int) -> str:
    """A device task's name in its run's task timings (migration 0006 writes the same)."""
    return f"round {round_index} device {device}"
