"""Batch planning: longest first, size and token budgets, duplicates generated once. Pure logic."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from fedqueue.errors import ConfigError
from fedqueue.llm.planner import PlannedBatch, approximate_tokens, deduplicate, plan_batches, token_counter
from fedqueue.llm.prompts import PromptLine


def test_batches_are_cut_longest_first_and_cover_every_prompt_once() -> None:
    lengths = [(f"k{i}", length) for i, length in enumerate([3, 50, 7, 50, 1, 20, 9])]
    batches = plan_batches(lengths, batch_size=3)
    assert [batch.keys for batch in batches] == [("k1", "k3", "k5"), ("k6", "k2", "k0"), ("k4",)]
    assert [batch.index for batch in batches] == [0, 1, 2]
    assert sorted(key for batch in batches for key in batch.keys) == sorted(key for key, _ in lengths)
    assert batches[0].tokens == (50, 50, 20)


def test_sorting_lowers_padding_against_input_order() -> None:
    lengths = [(f"k{i}", length) for i, length in enumerate([5, 100, 6, 90, 4, 110, 5, 95])]
    sorted_pad = sum(b.padded_tokens for b in plan_batches(lengths, batch_size=4))
    in_order = [
        PlannedBatch(0, (), tuple(n for _, n in lengths[:4])),
        PlannedBatch(1, (), tuple(n for _, n in lengths[4:])),
    ]
    assert sorted_pad < sum(b.padded_tokens for b in in_order)


def test_a_token_budget_bounds_each_padded_batch() -> None:
    lengths = [(f"k{i}", length) for i, length in enumerate([10, 10, 10, 10, 30, 5])]
    batches = plan_batches(lengths, batch_size=None, max_batch_tokens=60, max_new_tokens=10)
    for batch in batches:
        assert len(batch.keys) * (max(batch.tokens) + 10) <= 60
    assert [len(b.keys) for b in batches] == [1, 3, 2]


def test_a_prompt_over_the_budget_alone_gets_its_own_batch() -> None:
    batches = plan_batches([("big", 500), ("small", 2)], batch_size=8, max_batch_tokens=100)
    assert [b.keys for b in batches] == [("big",), ("small",)]


@pytest.mark.parametrize(
    ("size", "budget", "fragment"),
    [(None, None, "give at least one"), (0, None, "--batch-size"), (4, 0, "--max-batch-tokens")],
)
def test_bad_limits_are_config_errors(size: int | None, budget: int | None, fragment: str) -> None:
    with pytest.raises(ConfigError, match=fragment):
        plan_batches([("a", 1)], batch_size=size, max_batch_tokens=budget)


def test_pad_fraction() -> None:
    batch = PlannedBatch(0, ("a", "b"), (10, 5))
    assert batch.padded_tokens == 20 and batch.pad_fraction == pytest.approx(0.25)


def test_duplicates_map_to_the_first_copy() -> None:
    prompts = [
        PromptLine("line:1", None, 1, prompt="x"),
        PromptLine("line:2", None, 2, prompt="y"),
        PromptLine("id:z", "z", 3, prompt="x"),
        PromptLine("line:4", None, 4, messages=(("user", "x"),)),
    ]
    unique, copies = deduplicate(prompts)
    assert [p.key for p in unique] == ["line:1", "line:2", "line:4"]
    assert copies == {"id:z": "line:1"}


def test_token_counts_come_from_the_models_tokenizer(tiny_model_path: Path, tmp_path: Path) -> None:
    count = token_counter(tiny_model_path)
    assert count is not None
    # The character tokenizer: one token per character plus the bos token.
    assert count(PromptLine("a", None, 1, prompt="hello")) == 6
    assert token_counter(tmp_path) is None
    assert approximate_tokens(PromptLine("a", None, 1, prompt="x" * 40)) == 11


def test_planning_does_not_import_torch() -> None:
    code = "import sys, fedqueue.llm.planner, fedqueue.llm.job; print('torch' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"
