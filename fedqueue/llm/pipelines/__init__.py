"""LLM pipelines: a Python program per item that yields generation requests, runs plain Python between them
and returns the item's result; every item's calls are batched on the workers with no barrier between steps.

`Generate` is what a program yields; `fedqueue.llm.pipeline(...)` (fedqueue.llm.pipelines.api) runs one.
"""

from __future__ import annotations

from fedqueue.llm.pipelines.request import Generate

__all__ = ["Generate"]
