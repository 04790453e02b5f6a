"""Device tasks cut from a selection: one task per pack of devices, whatever the workers."""

from __future__ import annotations

from collections.abc import Sequence

from fedqueue.core.codec import BlobRef
from fedqueue.fl.config import RunConfig
from fedqueue.fl.messages import DeviceTask


def cut_packs(selected: Sequence[int], pack_size: int) -> list[tuple[int, ...]]:
    """A round's packs: its sorted selection cut into as few packs of at most `pack_size` devices as can hold
    it, their sizes one apart at most (the larger first), whatever the workers.

    Even sizes keep the round's slots evenly loaded: 10 devices by 3 make packs of 3, 3, 2 and 2, which two
    slots train 5 and 5, where 3, 3, 3 and 1 would hold one slot for 6 while the other waits after 4."""
    count = -(-len(selected) // pack_size)
    smaller, larger_count = divmod(len(selected), count) if count else (0, 0)
    packs: list[tuple[int, ...]] = []
    start = 0
    for index in range(count):
        size = smaller + (1 if index < larger_count else 0)
        packs.append(tuple(selected[start : start + size]))
        start += size
    return packs


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
