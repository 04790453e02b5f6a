"""fedqueue: federated-learning rounds on a Redis queue with GPU-pinned Celery workers.

The Python API (`submit`, `run`, `runs`, `local_cluster`, `RunHandle`) loads lazily, so
importing a submodule never pulls in Celery or torch it does not need.
"""

from __future__ import annotations

from typing import Any

__all__ = ["RunConfig", "RunHandle", "Settings", "local_cluster", "run", "runs", "submit"]


def __getattr__(name: str) -> Any:
    if name in {"RunHandle", "local_cluster", "run", "runs", "submit"}:
        from fedqueue import api

        return getattr(api, name)
    if name == "RunConfig":
        from fedqueue.fl.config import RunConfig

        return RunConfig
    if name == "Settings":
        from fedqueue.config import Settings

        return Settings
    raise AttributeError(f"module 'fedqueue' has no attribute {name!r}")
