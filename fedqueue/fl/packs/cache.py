"""Pack modes timed at submit, remembered on this machine: a config is timed once, then gets the same choice.

Timing a pack costs the submitting process a fraction of a second of training (and, on its first vmapped
step, torch's imports for it).
The choice depends on the model, its data and the local step, on this CPU and torch: those make the
key. Anything that cannot be read or written here only means timing again.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path

from fedqueue.fl.config import RunConfig

# Fields that change neither what a device trains nor how long a step takes.
NOT_TIMED = frozenset(
    {
        "name",
        "rounds",
        "max_model_version",
        "eval_every",
        "pack_size",
        "pack_mode",
        "pack_choice",
        "on_failure",
        "tensorboard_dir",
    }
)
MAX_ENTRIES = 256  # the oldest go first
# Raised whenever the same timings would make another choice (2: the buffered modes' vmap margin), or the
# timed work changed (3: a device trained alone copies its state no more; 4: a blob in shared memory is written
# over a freed one): a choice remembered under older rules is timed again.
CHOICE_RULES = 4


def cache_file() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "fedqueue" / "pack_modes.json"


def cache_key(config: RunConfig, pack: int) -> str:
    import torch

    timed = {name: value for name, value in config.to_dict().items() if name not in NOT_TIMED}
    machine = {"torch": torch.__version__, "cpus": os.cpu_count(), "pack": pack, "rules": CHOICE_RULES}
    text = json.dumps({"config": timed, "machine": machine}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def remembered(key: str) -> tuple[str, str] | None:
    """(mode, why) timed earlier for this key, or None."""
    entry = _read().get(key)
    if not isinstance(entry, list) or len(entry) != 2 or not all(isinstance(part, str) for part in entry):
        return None
    return entry[0], entry[1]


def remember(key: str, mode: str, why: str) -> None:
    entries = _read()
    entries.pop(key, None)
    entries[key] = [mode, why]
    kept = dict(list(entries.items())[-MAX_ENTRIES:])
    path = cache_file()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # Written whole, then renamed over the old file: a reader never sees half of it.
        with tempfile.NamedTemporaryFile("w", dir=path.parent, delete=False, suffix=".tmp") as handle:
            json.dump(kept, handle)
        os.replace(handle.name, path)
    except OSError:
        return


def _read() -> dict[str, object]:
    try:
        loaded = json.loads(cache_file().read_text())
    except (OSError, ValueError):
        return {}
    return loaded if isinstance(loaded, dict) else {}
