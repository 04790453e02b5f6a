"""The vLLM backend's parts that run without a GPU: its refusal on a CPU worker, and how completions become rows."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from fedqueue.errors import ConfigError
from fedqueue.llm.vllm_backend import load_vllm, to_generation


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for workers without a GPU")
def test_a_cpu_worker_refuses_vllm_in_one_line() -> None:
    with pytest.raises(ConfigError, match="^backend vllm: needs a GPU worker"):
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
