"""fedqueue: federated-learning rounds and LLM batch jobs on a Redis queue with GPU-pinned Celery workers.

The Python API loads lazily, so importing a submodule never pulls in Celery or torch it does not
need: `run`, `submit`, `RunHandle` and `RunConfig` are FL's (fedqueue.fl.api), `runs`, `cancel` and
`local_cluster` serve every kind (fedqueue.api), and `fedqueue.llm.run`, `submit` and `get_job` are
LLM batch jobs' (fedqueue.llm.api).
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["RunConfig", "RunHandle", "Settings", "cancel", "llm", "local_cluster", "run", "runs", "submit"]

_HOMES = {
    "RunConfig": "fedqueue.fl.api",
    "RunHandle": "fedqueue.fl.api",
    "run": "fedqueue.fl.api",
    "submit": "fedqueue.fl.api",
    "local_cluster": "fedqueue.api",
    "runs": "fedqueue.api",
    "cancel": "fedqueue.api",
    "Settings": "fedqueue.config",
}


def __getattr__(name: str) -> Any:
    if name == "llm":  # a subpackage: `import fedqueue` then `fedqueue.llm.run(...)`
        return importlib.import_module("fedqueue.llm")
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'fedqueue' has no attribute {name!r}")
    return getattr(importlib.import_module(home), name)
