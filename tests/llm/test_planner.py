"""Batch planning: longest first, equal shares per worker slot, padding and size bounds, duplicates once. Pure."""

from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from fedqueue.errors import ConfigError
from fedqueue.llm.planner import (
    MAX_PAD_FRACTION,
    PlannedBatch,
    approximate_tokens,
    deduplicate,
    plan_batches,
    token_counter,
)
from fedqueue.llm.prompts import PromptLine


def mixed_lengths(count: int = 96, seed: int = 0) -> list[tuple[str, int]]:
    """Prompt lengths from 10 to 170 tokens in no order, like a file of short questions."""
    generator = random.Random(seed)
    return [(f"k{i}", generator.randint(10, 170)) for i in range(count)]


def weight(batch: PlannedBatch, new_tokens: int) -> int:
    return sum(batch.tokens) + new_tokens * len(batch.keys)


def pad_fraction(batches: list[PlannedBatch]) -> float:
    return 1 - sum(sum(batch.tokens) for batch in batches) / sum(batch.padded_tokens for batch in batches)


def test_batches_are_cut_longest_first_and_cover_every_prompt_once() -> None:
    lengths = [(f"k{i}", length) for i, length in enumerate([3, 50, 7, 50, 1, 20, 9])]
    batches = plan_batches(lengths, batch_size=3)
    assert [batch.index for batch in batches] == list(range(len(batches)))
    in_order = [key for batch in batches for key in batch.keys]
    assert in_order == ["k1", "k3", "k5", "k6", "k2", "k0", "k4"]  # longest first, equal lengths in input order
    assert all(len(batch.keys) <= 3 for batch in batches)


def test_sorting_lowers_padding_against_input_order() -> None:
    lengths = [(f"k{i}", length) for i, length in enumerate([5, 100, 6, 90, 4, 110, 5, 95])]
    sorted_pad = sum(b.padded_tokens for b in plan_batches(lengths, batch_size=4))
    in_order = [
        PlannedBatch(0, (), tuple(n for _, n in lengths[:4])),
        PlannedBatch(1, (), tuple(n for _, n in lengths[4:])),
    ]
    assert sorted_pad < sum(b.padded_tokens for b in in_order)


@pytest.mark.parametrize("slots", [1, 2, 3, 4, 8])
def test_never_fewer_batches_than_slots_and_a_multiple_of_them(slots: int) -> None:
    """96 short prompts on 2 slots were once 3 batches of 32: one slot idle for the third."""
    lengths = [(f"k{i}", 12 + i % 5) for i in range(96)]
    batches = plan_batches(lengths, batch_size=32, max_new_tokens=32, slots=slots)
    assert len(batches) >= slots and len(batches) % slots == 0


def test_fewer_prompts_than_slots_get_a_batch_each() -> None:
    batches = plan_batches([("a", 5), ("b", 9), ("c", 1)], batch_size=32, slots=4)
    assert [batch.keys for batch in batches] == [("b",), ("a",), ("c",)]


@pytest.mark.parametrize("slots", [1, 2, 4])
def test_each_batch_holds_an_equal_share_of_the_tokens(slots: int) -> None:
    lengths, new_tokens = mixed_lengths(), 32
    batches = plan_batches(lengths, batch_size=64, max_new_tokens=new_tokens, slots=slots)
    share = sum(length + new_tokens for _, length in lengths) / len(batches)
    largest_prompt = max(length for _, length in lengths) + new_tokens
    # A cut falls between whole prompts: each batch is within one prompt of its share.
    assert all(abs(weight(batch, new_tokens) - share) <= largest_prompt for batch in batches)
    # Dealt to the slots in turn (the order idle workers take them), each slot's total is within one prompt
    # per batch it takes of an equal part of the job.
    totals = [sum(weight(batch, new_tokens) for batch in batches[slot::slots]) for slot in range(slots)]
    per_slot = len(batches) // slots
    assert all(abs(total - per_slot * share) <= per_slot * largest_prompt for total in totals)


def test_padding_stays_under_the_bound_on_mixed_lengths() -> None:
    lengths = mixed_lengths()
    for slots in (1, 2, 4):
        batches = plan_batches(lengths, batch_size=32, max_new_tokens=32, slots=slots)
        assert pad_fraction(batches) <= MAX_PAD_FRACTION
    tighter = plan_batches(lengths, batch_size=32, max_new_tokens=32, slots=2, max_pad_fraction=0.03)
    assert pad_fraction(tighter) <= 0.03


@pytest.mark.parametrize(("batch_size", "slots"), [(8, 2), (5, 3), (32, 2)])
def test_batch_size_is_an_upper_bound(batch_size: int, slots: int) -> None:
    lengths = mixed_lengths(200, seed=3)
    batches = plan_batches(lengths, batch_size=batch_size, max_new_tokens=16, slots=slots)
    assert max(len(batch.keys) for batch in batches) <= batch_size
    assert len(batches) % slots == 0
    assert sorted(key for batch in batches for key in batch.keys) == sorted(key for key, _ in lengths)


def test_a_large_job_keeps_full_batches() -> None:
    """Where --batch-size binds, short prompts' batches hold fewer tokens rather than long ones few rows."""
    lengths = mixed_lengths(20_000, seed=1)
    batches = plan_batches(lengths, batch_size=32, max_new_tokens=64, slots=8)
    assert len(batches) % 8 == 0 and len(batches) <= 20_000 / 32 * 1.2
    assert pad_fraction(batches) <= MAX_PAD_FRACTION


def test_the_plan_depends_only_on_the_input_and_the_slots() -> None:
    lengths = mixed_lengths()
    first = plan_batches(lengths, batch_size=32, max_new_tokens=32, slots=2)
    assert plan_batches(list(lengths), batch_size=32, max_new_tokens=32, slots=2) == first
    assert plan_batches(lengths, batch_size=32, max_new_tokens=32, slots=3) != first
    code = (
        "import random; from fedqueue.llm.planner import plan_batches; g = random.Random(0); "
        "lengths = [(f'k{i}', g.randint(10, 170)) for i in range(96)]; "
        "print([b.keys for b in plan_batches(lengths, batch_size=32, max_new_tokens=32, slots=2)])"
    )
    for hash_seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": hash_seed}
        result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
        assert result.stdout.strip() == str([batch.keys for batch in first])


def test_a_token_budget_bounds_each_padded_batch() -> None:
    lengths = [(f"k{i}", length) for i, length in enumerate([10, 10, 10, 10, 30, 5])]
    batches = plan_batches(lengths, batch_size=None, max_batch_tokens=60, max_new_tokens=10)
    for batch in batches:
        assert len(batch.keys) * (max(batch.tokens) + 10) <= 60
    assert sum(len(b.keys) for b in batches) == 6


def test_a_prompt_over_the_budget_alone_gets_its_own_batch() -> None:
    batches = plan_batches([("big", 500), ("small", 2)], batch_size=8, max_batch_tokens=100)
    assert [b.keys for b in batches] == [("big",), ("small",)]


@pytest.mark.parametrize(
    ("size", "budget", "slots", "fragment"),
    [
        (None, None, 1, "give at least one"),
        (0, None, 1, "--batch-size"),
        (4, 0, 1, "--max-batch-tokens"),
        (4, None, 0, "slots"),
    ],
)
def test_bad_limits_are_config_errors(size: int | None, budget: int | None, slots: int, fragment: str) -> None:
    with pytest.raises(ConfigError, match=fragment):
        plan_batches([("a", 1)], batch_size=size, max_batch_tokens=budget, slots=slots)


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
