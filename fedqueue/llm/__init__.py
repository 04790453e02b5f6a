"""The LLM batch-inference job kind.

Its Python API (fedqueue.llm.api, fedqueue.llm.pipelines.api) loads lazily, so a worker importing the kind never
pulls it in: `fedqueue.llm.run(prompts, model=...)`, `submit`, `get_job` and `JobHandle`; `pipeline(items,
program=..., model=...)` and `Generate`, what a pipeline's program yields.
"""

from __future__ import annotations

import importlib
from typing import Any

_HOMES = {
    "GenerationSettings": "fedqueue.llm.api",
    "JobHandle": "fedqueue.llm.api",
    "get_job": "fedqueue.llm.api",
    "run": "fedqueue.llm.api",
    "submit": "fedqueue.llm.api",
    "Generate": "fedqueue.llm.pipelines.request",
    "pipeline": "fedqueue.llm.pipelines.api",
    "PipelineHandle": "fedqueue.llm.pipelines.api",
}
__all__ = sorted(_HOMES)


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module 'fedqueue.llm' has no attribute {name!r}")
    return getattr(importlib.import_module(_HOMES[name]), name)
