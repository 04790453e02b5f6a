"""Device tasks cut from a selection: one task per pack of devices, whatever the workers."""

from __future__ import annotations

from collections.abc import Sequence

from fedqueue.core.codec import BlobRef
from fedqueue.fl.config import RunConfig
from fedqueue.fl.messages import DeviceTask


def cut_packs(selected: Sequence[int], pack_size: int) -> list[tuple[int, ...]]:
    """A round's packs: its sorted selection cut every `pack_size` devices, whatever the workers."""
    return [tuple(selected[start : start + pack_size]) for start in range(0, len(selected), pack_size)]


def tasks_of_round(
    run_id: str, round_index: int, config: RunConfig, selected: Sequence[int], model: BlobRef, enqueued_at: float
) -> list[DeviceTask]:
    """The device tasks of a round, one per pack."""
    packs = cut_packs(selected, config.packing.resolved_size)
    return tasks_of_packs(run_id, round_index, config, packs, model, enqueued_at, len(selected))


def tasks_of_packs(
    run_id: str,
    round_index: int,
    config: RunConfig,
    packs: Sequence[tuple[int, ...]],
    model: BlobRef,
    enqueued_at: float,
    round_size: int,
) -> list[DeviceTask]:
    """One device task per pack, all training `model`; a pack of one device always trains as it would alone."""
    return [
        DeviceTask(
            run_id=run_id,
            round_index=round_index,
            devices=pack,
            model=model,
            enqueued_at=enqueued_at,
            round_size=round_size,
            mode=config.packing.resolved_mode if len(pack) > 1 else "sequential",
        )
        for pack in packs
    ]
