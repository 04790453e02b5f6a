"""The LLM backends by name: the two that ship, and any registered beside them."""

from __future__ import annotations

from fedqueue.errors import ConfigError
from fedqueue.llm.backends.base import LlmBackend
from fedqueue.llm.backends.transformers import TransformersBackend
from fedqueue.llm.backends.vllm import VllmBackend

_backends: dict[str, LlmBackend] = {backend.name: backend for backend in (TransformersBackend(), VllmBackend())}


def register(backend: LlmBackend) -> None:
    """Add a backend (or replace one of its name): jobs name it with `backend`, workers generate with it."""
    _backends[backend.name] = backend


def names() -> tuple[str, ...]:
    return tuple(_backends)


def get(name: str) -> LlmBackend:
    """The backend of that name; a ConfigError naming the known ones for any other."""
    found = _backends.get(name)
    if found is None:
        raise ConfigError(f"backend: must be one of {', '.join(names())}")
    return found
