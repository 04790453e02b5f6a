"""Which GPUs CUDA_VISIBLE_DEVICES shows this process, read one way everywhere and without touching CUDA.

Standard library only: FL's device code (fedqueue.fl.ml.torch_device) reads it too, and imports no store or broker.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

VARIABLE = "CUDA_VISIBLE_DEVICES"


def visible_gpus(environ: Mapping[str, str] | None = None) -> list[str] | None:
    """The GPUs the variable names (indices or UUIDs, spaces stripped, blank entries skipped), in its order;
    None when it is unset, which leaves every GPU of the host visible.

    Empty, or "-1", hides them all: []. As in CUDA, a negative entry ends the list ("0,-1,1" shows GPU 0 only).
    """
    value = (os.environ if environ is None else environ).get(VARIABLE)
    if value is None:
        return None
    gpus: list[str] = []
    for part in value.split(","):
        name = part.strip()
        if name.startswith("-"):
            break
        if name:
            gpus.append(name)
    return gpus
