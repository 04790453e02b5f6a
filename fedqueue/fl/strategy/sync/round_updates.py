"""A sync round's stored updates as its aggregation folds them: one per device stored alone, one per pack
pre-summed by its worker, in the order of their (lowest) devices."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy.engine import Row

from fedqueue.core.codec import BlobRef
from fedqueue.fl.messages import is_pack_sum_key


@dataclass(frozen=True)
class StoredUpdate:
    """A device's update, or a pack's pre-summed share (its lowest device, its devices' samples)."""

    device: int
    samples: int
    ref: BlobRef
    summed: bool


def updates_of(results: Sequence[Row[Any]]) -> list[StoredUpdate]:
    """The updates of a round's done results (light rows with update refs), by (lowest) device."""
    alone: list[StoredUpdate] = []
    packs: dict[str, list[Row[Any]]] = {}
    for task in results:
        assert task.update_key and task.update_sha256 and task.update_nbytes is not None
        if is_pack_sum_key(task.update_key):
            packs.setdefault(task.update_key, []).append(task)
            continue
        ref = BlobRef(key=task.update_key, sha256=task.update_sha256, nbytes=task.update_nbytes)
        alone.append(StoredUpdate(task.device, task.samples, ref, summed=False))
    summed = [
        StoredUpdate(
            min(task.device for task in pack),
            sum(task.samples for task in pack),
            BlobRef(key=key, sha256=pack[0].update_sha256, nbytes=pack[0].update_nbytes),
            summed=True,
        )
        for key, pack in packs.items()
    ]
    return sorted(alone + summed, key=lambda update: update.device)


def leading_done(selected: Sequence[int], outcomes: Sequence[Row[Any]]) -> list[Row[Any]]:
    """The results of the round's lowest devices up to its first one not done yet (or failed), with every
    member of their packs: the updates that come first in the aggregation's order, whatever comes later."""
    by_device = {row.device: row for row in outcomes}
    leading: list[Row[Any]] = []
    for device in sorted(selected):
        row = by_device.get(device)
        if row is None or row.state != "done":
            break
        leading.append(row)
    keys = {row.update_key for row in leading}
    devices = {row.device for row in leading}
    # A pack's rows are stored together: its members past the first pending device are done as well.
    members = [row for row in outcomes if row.device not in devices and row.state == "done" and row.update_key in keys]
    return leading + members
