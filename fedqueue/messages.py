"""Task messages: small, frozen, JSON-only. Each owns its encoding and its checks."""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass
from typing import Any

from fedqueue.errors import FedqueueError


_SHA256 = re.compile(r"[0-9a-f]{64}")
_INT_LIMIT = 2**31  # what the store's integer columns hold


class MessageError(FedqueueError):
    """A message from the queue is malformed; it is rejected, never executed."""


@dataclass(frozen=True)
class BlobRef:
    """Where a tensor blob lives and the sha256 it must have when read back."""

    key: str
    sha256: str
    nbytes: int

    @classmethod
    def from_dict(cls, raw: Any) -> BlobRef:
        _require_fields(raw, {"key": str, "sha256": str, "nbytes": int}, "blob")
        if not _SHA256.fullmatch(raw["sha256"]):
            raise MessageError("blob.sha256: expected 64 lowercase hex characters")
        if raw["nbytes"] < 0:
            raise MessageError("blob.nbytes: must be 0 or more")
        return cls(key=raw["key"], sha256=raw["sha256"], nbytes=raw["nbytes"])


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
        _require_fields(
            raw,
            {
                "run_id": str, "round_index": int, "device": int, "model": dict, "enqueued_at": (int, float),
                "round_size": int,
            },
            "task",
        )
        if not 1 <= raw["round_index"] < _INT_LIMIT:
            raise MessageError("task.round_index: out of range")
        if not 0 <= raw["device"] < _INT_LIMIT:
            raise MessageError("task.device: out of range")
        if not math.isfinite(raw["enqueued_at"]):
            raise MessageError("task.enqueued_at: must be a finite number")
        if not 1 <= raw["round_size"] < _INT_LIMIT:
            raise MessageError("task.round_size: out of range")
        return cls(
            run_id=raw["run_id"],
            round_index=raw["round_index"],
            device=raw["device"],
            model=BlobRef.from_dict(raw["model"]),
            enqueued_at=float(raw["enqueued_at"]),
            round_size=raw["round_size"],
        )


def _require_fields(raw: Any, spec: dict[str, type | tuple[type, ...]], what: str) -> None:
    if not isinstance(raw, dict):
        raise MessageError(f"{what}: expected a JSON object, got {type(raw).__name__}")
    unknown = set(raw) - set(spec)
    if unknown:
        raise MessageError(f"{what}: unknown field {sorted(unknown)[0]!r}")
    for name, expected in spec.items():
        if name not in raw:
            raise MessageError(f"{what}.{name}: missing")
        value = raw[name]
        if isinstance(value, bool) or not isinstance(value, expected):
            raise MessageError(f"{what}.{name}: wrong type {type(value).__name__}")
