"""The FL job kind's task messages: small, frozen, JSON-only. Each owns its encoding and its checks.

Also the names of the blobs they point to (global models, updates): running clusters hold these names, so
they never change.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

from fedqueue.core.codec import INT_LIMIT, BlobRef, MessageError, require_fields

KIND_NAME = "fl"  # the job kind these messages belong to, as runs and task timings name it
DEVICES_QUEUE = "devices"  # the queue (a suffix of the prefixed name) device tasks travel on
PACK_MODES = ("sequential", "vmap")
LABEL_DEVICES = 32  # devices a pack's label lists
PACK_MAX = 10_000  # devices in one task message: beyond this a message outgrows its purpose
PACK_SUM_MARK = "pack-"  # in an update's name: the blob is a pack's pre-summed update


def global_key(run_id: str, version: int) -> str:
    """A run's published global model of one version (its scheduler publishes it)."""
    return f"{run_id}/global/{version}"


def update_key(run_id: str, round_index: int, device: int) -> str:
    """One device's trained update, uploaded by its worker."""
    # A fresh suffix per attempt: a duplicate delivery never overwrites the stored winner's blob.
    return f"{run_id}/update/{round_index}/{device}/{uuid.uuid4().hex[:8]}"


def pack_sum_key(run_id: str, round_index: int, devices: Sequence[int]) -> str:
    """A vmapped pack's pre-summed update, one blob for all its devices' rows (uploaded by its worker)."""
    return f"{run_id}/update/{round_index}/{PACK_SUM_MARK}{devices[0]}-{devices[-1]}/{uuid.uuid4().hex[:8]}"


def is_pack_sum_key(key: str) -> bool:
    return key.split("/")[-2].startswith(PACK_SUM_MARK)


@dataclass(frozen=True)
class DeviceTask:
    """Train a pack of simulated devices for one round, starting from a global model version.

    A pack of one device is the plain device task. `mode` says how a larger pack trains:
    "sequential" (back to back, each exactly as alone) or "vmap" (one stacked step at a time).
    """

    run_id: str
    round_index: int
    devices: tuple[int, ...]  # sorted, cut from the round's sorted selection
    model: BlobRef
    enqueued_at: float
    round_size: int  # devices selected in the round: the worker storing the last result closes it
    mode: str = "sequential"

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "devices": list(self.devices)}

    @classmethod
    def from_dict(cls, raw: Any) -> DeviceTask:
        require_fields(
            raw,
            {
                "run_id": str,
                "round_index": int,
                "devices": list,
                "model": dict,
                "enqueued_at": (int, float),
                "round_size": int,
                "mode": str,
            },
            "task",
        )
        if not 1 <= raw["round_index"] < INT_LIMIT:
            raise MessageError("task.round_index: out of range")
        devices = raw["devices"]
        if not 1 <= len(devices) <= PACK_MAX:
            raise MessageError(f"task.devices: 1 to {PACK_MAX} devices, got {len(devices)}")
        if not all(isinstance(device, int) and not isinstance(device, bool) for device in devices):
            raise MessageError("task.devices: must be integers")
        if not all(0 <= device < INT_LIMIT for device in devices):
            raise MessageError("task.devices: out of range")
        if any(later <= earlier for earlier, later in zip(devices, devices[1:], strict=False)):
            raise MessageError("task.devices: must be sorted and distinct")
        if raw["mode"] not in PACK_MODES:
            raise MessageError(f"task.mode: one of {', '.join(PACK_MODES)}")
        if not math.isfinite(raw["enqueued_at"]):
            raise MessageError("task.enqueued_at: must be a finite number")
        if not 1 <= raw["round_size"] < INT_LIMIT:
            raise MessageError("task.round_size: out of range")
        return cls(
            run_id=raw["run_id"],
            round_index=raw["round_index"],
            devices=tuple(devices),
            model=BlobRef.from_dict(raw["model"]),
            enqueued_at=float(raw["enqueued_at"]),
            round_size=raw["round_size"],
            mode=raw["mode"],
        )

    @property
    def attempt_key(self) -> str:
        if len(self.devices) == 1:
            return f"{self.run_id}:{self.round_index}:{self.devices[0]}"
        return f"{self.run_id}:{self.round_index}:{self.pack}"

    @property
    def pack(self) -> str | None:
        """The pack's name in timings and labels ("pack 3-17"); None for a single device."""
        if len(self.devices) == 1:
            return None
        return f"pack {self.devices[0]}-{self.devices[-1]}"

    @property
    def label(self) -> str:
        if len(self.devices) == 1:
            return f"run {self.run_id} round {self.round_index} device {self.devices[0]}"
        # What Flower shows in its task list: the devices too, the first few of a long pack.
        shown = ", ".join(str(device) for device in self.devices[:LABEL_DEVICES])
        more = ", ..." if len(self.devices) > LABEL_DEVICES else ""
        return (
            f"run {self.run_id} round {self.round_index} {self.pack} "
            f"({len(self.devices)} devices, {self.mode}): {shown}{more}"
        )

    def alone(self, device: int, enqueued_at: float) -> DeviceTask:
        """One of this pack's devices as a task of its own: how a pack that failed every attempt is retried."""
        return replace(self, devices=(device,), enqueued_at=enqueued_at, mode="sequential")


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
        return aggregation_name(self.round_index)


@dataclass(frozen=True)
class FoldTask:
    """Buffered async: take the run's stored updates in simulated order, make versions, refill slots."""

    run_id: str
    enqueued_at: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, raw: Any) -> FoldTask:
        require_fields(raw, {"run_id": str, "enqueued_at": (int, float)}, "fold")
        if not math.isfinite(raw["enqueued_at"]):
            raise MessageError("fold.enqueued_at: must be a finite number")
        return cls(run_id=raw["run_id"], enqueued_at=float(raw["enqueued_at"]))

    @property
    def attempt_key(self) -> str:
        return fold_key(self.run_id)

    @property
    def label(self) -> str:
        return f"run {self.run_id} fold"


def fold_key(run_id: str) -> str:
    """The key that counts a run's failed fold passes in a row and marks a pass requested."""
    return f"fold:{run_id}"


def aggregate_key(run_id: str, round_index: int) -> str:
    """The key that counts a round's aggregation attempts and marks it requested."""
    return f"aggregate:{run_id}:{round_index}"


def aggregation_name(round_index: int) -> str:
    """A round's aggregation (or the version a fold pass made for it) in its run's task timings."""
    return f"round {round_index} aggregation"


def device_task_name(round_index: int, device: int) -> str:
    """A device task's name in its run's task timings (migration 0006 writes the same)."""
    return f"round {round_index} device {device}"
