"""How `pack_size = "auto"` and `pack_mode = "auto"` are resolved when a run is submitted.

Pure rules, so they test without workers: the choice is written into the run's config,
and the report shows it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

# Packs per slot: a round keeps every slot busy twice over, so one slow pack leaves no slot idle long.
PACKS_PER_SLOT = 2
# Past this a pack gains little on a CPU and holds one task a long time against the time limit.
AUTO_PACK_MAX = 64


def auto_pack_size(devices_per_round: int, slots: int) -> int:
    """Devices per task: enough packs for every slot twice over, at most AUTO_PACK_MAX devices each."""
    packs = PACKS_PER_SLOT * max(1, slots)
    return max(1, min(AUTO_PACK_MAX, math.ceil(devices_per_round / packs)))


def total_slots(workers: Mapping[str, int]) -> int:
    return sum(max(1, slots) for slots in workers.values())


def has_gpu_workers(workers: Mapping[str, int]) -> bool:
    """fedqueue names a GPU worker gpuN@host (gpuN-M@host for several per GPU)."""
    return any(name.startswith("gpu") for name in workers)


# A vmapped pack also stores one summed update where a sequential pack stores one per device, so on
# a near tie vmap wins; it loses only when its step is clearly slower (vmapped convolutions on a CPU).
VMAP_TOLERANCE = 1.1


def auto_pack_mode(has_convolution: bool, on_gpu: bool, vmap_refused: str | None) -> tuple[str, str]:
    """(mode, why) by rule, where nothing was timed. vmapped convolutions are slower than a loop on a CPU."""
    if vmap_refused is not None:
        return "sequential", f"vmap refused: {vmap_refused}"
    if has_convolution and not on_gpu:
        return "sequential", "convolutions on CPU workers train faster one device at a time"
    return "vmap", "GPU workers" if on_gpu else "no convolutions: stacked steps pay on a CPU"


# Where a pack's devices each upload their own update (FedBuff), vmap has no summed upload to win a tie with, and
# taking the stacked weights apart costs more in a run than in the trial on a big state (a 45 MB state timed
# 1.0-1.1x faster vmapped ran 1.6x slower): vmap there only when clearly faster.
UNSUMMED_VMAP_MARGIN = 1.25


def measured_pack_mode(sequential_s: float, vmap_s: float, presums: bool = True) -> tuple[str, str]:
    """(mode, why) from one pack's local update timed both ways on a CPU (seconds per device); `presums`: a
    vmapped pack uploads one summed update."""
    timed = f"timed {sequential_s * 1000:.2f} ms a device's update back to back, {vmap_s * 1000:.2f} ms vmapped"
    if presums and vmap_s <= sequential_s * VMAP_TOLERANCE:
        return "vmap", timed
    if not presums and vmap_s * UNSUMMED_VMAP_MARGIN <= sequential_s:
        return "vmap", timed
    if vmap_s <= sequential_s:
        return "sequential", f"{timed} (vmap less than {UNSUMMED_VMAP_MARGIN}x faster, each device uploading alone)"
    return "sequential", f"{timed} (vmap {vmap_s / sequential_s:.1f}x slower)"
