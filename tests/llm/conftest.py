"""A tiny random Llama, built once per test session and loaded through the same path a user's model takes."""

from __future__ import annotations

from pathlib import Path

import pytest

from fedqueue.llm.model import LoadedModel, load_model
from fedqueue.llm.tiny import build_bench_llama, build_tiny_llama


@pytest.fixture(scope="session")
def tiny_model_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_llama(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture
def loaded(tiny_model_path: Path) -> LoadedModel:
    """A fresh load per test: tests patch its generate and it remembers its largest batch."""
    return load_model(str(tiny_model_path))


@pytest.fixture(scope="session")
def slow_model_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The ~25M benchmark model: a batch takes seconds on a CPU, long enough to kill a worker in the middle of it."""
    return build_bench_llama(tmp_path_factory.mktemp("bench-llama"))


@pytest.fixture(scope="session")
def tiny_gguf_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny Llama as a GGUF file (float32 tensors), read through transformers' GGUF loader like a real one."""
    pytest.importorskip("gguf")
    from fedqueue.llm.tiny import build_tiny_gguf

    return build_tiny_gguf(tmp_path_factory.mktemp("tiny-gguf") / "tiny.gguf")
