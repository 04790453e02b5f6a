"""The LLM batch-inference job kind.

Its Python API (fedqueue.llm.api) loads lazily, so a worker importing the kind never pulls it in:
`fedqueue.llm.run(prompts, model=...)`, `submit`, `get_job` and `JobHandle`.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["GenerationSettings", "JobHandle", "get_job", "run", "submit"]


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError(f"module 'fedqueue.llm' has no attribute {name!r}")
    return getattr(importlib.import_module("fedqueue.llm.api"), name)
