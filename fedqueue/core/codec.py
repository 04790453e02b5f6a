"""What every job kind's messages share: JSON-only field checks, the error for a bad message, blob references."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from fedqueue.errors import FedqueueError

_SHA256 = re.compile(r"[0-9a-f]{64}")
INT_LIMIT = 2**31  # what the store's integer columns hold


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
        require_fields(raw, {"key": str, "sha256": str, "nbytes": int}, "blob")
        if not _SHA256.fullmatch(raw["sha256"]):
            raise MessageError("blob.sha256: expected 64 lowercase hex characters")
        if raw["nbytes"] < 0:
            raise MessageError("blob.nbytes: must be 0 or more")
        return cls(key=raw["key"], sha256=raw["sha256"], nbytes=raw["nbytes"])


def require_fields(raw: Any, spec: dict[str, type | tuple[type, ...]], what: str) -> None:
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
