"""What a run's device count costs in memory, estimated at submit: a run that would not fit is refused there,
with the number it would need, before anything of it is stored.

The estimate is the arrays that grow with the devices, in each process that holds them (the command that
follows the run, and every worker process on this machine): the device clock's per-device draws and their
temporaries while built, the selection's permutation, and each device's shard where the partition keeps them.
It leaves out what every process holds whatever the device count (the interpreter, torch, the model).
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass

import psutil

from fedqueue.errors import ConfigError
from fedqueue.fl.config import RunConfig

# The device clock: a speed class (4 bytes) and a training work (8) kept a device, and the draws and the
# inverse index (8 each) while it is built; FedRevive's phases keep a float64 mean a phase (3), drawn alike.
CLOCK_BYTES = 40
PHASE_CLOCK_BYTES = 3 * 24
SELECTION_BYTES = 8  # a round's selection draws a permutation of every device (int64)
SHARD_SAMPLE_BYTES = 4  # dirichlet_fixed keeps every dealt device's positions (int32)
PART_BYTES = 120  # iid / dirichlet: an index array a device (its header, as numpy makes it), besides its samples


@dataclass(frozen=True)
class MemoryNeed:
    """Bytes a device in each process that holds the run, those processes, and all of it."""

    per_device: int
    processes: int

    def total(self, devices: int) -> int:
        return self.per_device * devices * self.processes


def per_device_bytes(config: RunConfig) -> int:
    data = config.data
    clock = PHASE_CLOCK_BYTES if config.timing.phased else CLOCK_BYTES
    if data.partition == "dirichlet_fixed" and data.client_data_size is not None:
        shards = SHARD_SAMPLE_BYTES * data.client_data_size
    elif data.fixed_shards:
        shards = 0  # dirichlet_fixed_per_device: each drawn when read, none kept
    else:
        shards = PART_BYTES
    return clock + SELECTION_BYTES + shards


def processes_here(workers: Mapping[str, int] | None) -> int:
    """This process and the worker processes on this machine (a worker is named name@host): those that answered,
    one if none did; where they were not asked (a packing not "auto"), one a core, as a local cluster starts."""
    if workers is None:
        return 1 + (os.cpu_count() or 1)
    host = socket.gethostname()
    here = sum(1 for name in workers if name.rpartition("@")[2] == host)
    return 1 + max(here, 1)


def check_fits(config: RunConfig, workers: Mapping[str, int] | None, available: int | None = None) -> None:
    """ConfigError naming num_devices when the estimate exceeds the memory this machine has available."""
    need = MemoryNeed(per_device_bytes(config), processes_here(workers))
    total = need.total(config.num_devices)
    free = psutil.virtual_memory().available if available is None else available
    if total > free:
        raise ConfigError(
            f"num_devices: {config.num_devices:,} devices need about {_gib(total)} of memory"
            f" ({need.per_device} bytes a device in each of {need.processes} processes), and this machine has"
            f" {_gib(free)} available"
        )


def _gib(size: int) -> str:
    return f"{size / 2**30:,.1f} GiB" if size >= 2**30 else f"{size / 2**20:,.1f} MiB"
