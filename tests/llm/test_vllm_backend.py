"""The vLLM backend's parts that run without vLLM: its refusal on a worker without it, and how completions become rows."""

from __future__ import annotations

import importlib.util
from types import SimpleNamespace

import pytest

from fedqueue.errors import ConfigError
from fedqueue.llm.backends.vllm_engine import load_vllm, to_generation


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="the refusal is for workers without vllm")
def test_a_worker_without_vllm_refuses_it_in_one_line() -> None:
    with pytest.raises(ConfigError, match="^backend vllm: vllm is not installed on this worker"):
        load_vllm("any-model", "auto")


@pytest.mark.parametrize(
    ("reason", "finish", "output", "error"),
    [
        ("stop", "stop", "hi", None),
        ("length", "length", "hi", None),
        ("abort", None, None, "vllm ended the prompt: abort"),
    ],
)
def test_completions_become_rows(reason: str, finish: str | None, output: str | None, error: str | None) -> None:
    # A completion as vLLM returns it: its text, its token ids, why it ended (plain data, no engine).
    completion = SimpleNamespace(text="hi", token_ids=[5, 6, 2], finish_reason=reason)
    row = to_generation("id:q", 7, completion)
    assert (row.key, row.output, row.prompt_tokens, row.generated_tokens) == ("id:q", output, 7, 3)
    assert (row.finish_reason, row.error) == (finish, error)
