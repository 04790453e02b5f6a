"""Cutting a job's prompts into batches: each prompt generated once, similar lengths together.

A batch pads every prompt to its longest, so batches are cut from the prompts sorted longest
first: little padding, and the batch most likely to run out of memory runs first, where the
worker learns the size that fits. No torch here.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from fedqueue.errors import ConfigError
from fedqueue.llm.prompts import PromptLine

CHARACTERS_PER_TOKEN = 4  # a rough English average, for models without a tokenizer.json


@dataclass(frozen=True)
class PlannedBatch:
    index: int
    keys: tuple[str, ...]
    tokens: tuple[int, ...]  # each prompt's length in tokens, in `keys` order

    @property
    def padded_tokens(self) -> int:
        return len(self.tokens) * max(self.tokens, default=0)

    @property
    def pad_fraction(self) -> float:
        padded = self.padded_tokens
        return 0.0 if padded == 0 else 1.0 - sum(self.tokens) / padded


def deduplicate(prompts: Sequence[PromptLine]) -> tuple[list[PromptLine], dict[str, str]]:
    """Prompts to generate (the first of each text), and every later copy's key -> the first one's key.

    Equal prompts generate equal outputs (seeds follow the text), so a copy is stored, not generated.
    """
    first: dict[str, str] = {}
    unique: list[PromptLine] = []
    copies: dict[str, str] = {}
    for prompt in prompts:
        canonical = first.setdefault(prompt.text_key, prompt.key)
        if canonical == prompt.key:
            unique.append(prompt)
        else:
            copies[prompt.key] = canonical
    return unique, copies


def plan_batches(
    lengths: Sequence[tuple[str, int]],
    *,
    batch_size: int | None = 32,
    max_batch_tokens: int | None = None,
    max_new_tokens: int = 0,
) -> list[PlannedBatch]:
    """Batches of (key, prompt tokens), longest first, numbered from 0.

    A batch holds at most `batch_size` prompts and, with `max_batch_tokens`, at most that many
    tokens once padded and generated (prompts x (longest + max_new_tokens)). A prompt too long
    for the token budget on its own still gets a batch of one: the worker decides whether it fits.
    """
    if batch_size is None and max_batch_tokens is None:
        raise ConfigError("--batch-size or --max-batch-tokens: give at least one")
    if batch_size is not None and batch_size < 1:
        raise ConfigError(f"--batch-size: must be at least 1, got {batch_size}")
    if max_batch_tokens is not None and max_batch_tokens < 1:
        raise ConfigError(f"--max-batch-tokens: must be at least 1, got {max_batch_tokens}")
    ordered = sorted(lengths, key=lambda item: -item[1])  # stable: equal lengths keep input order
    batches: list[PlannedBatch] = []
    keys: list[str] = []
    tokens: list[int] = []
    for key, length in ordered:
        longest = tokens[0] if tokens else length  # sorted: the first prompt of a batch is its longest
        full = batch_size is not None and len(keys) >= batch_size
        over = max_batch_tokens is not None and (len(keys) + 1) * (longest + max_new_tokens) > max_batch_tokens
        if keys and (full or over):
            batches.append(PlannedBatch(len(batches), tuple(keys), tuple(tokens)))
            keys, tokens = [], []
        keys.append(key)
        tokens.append(length)
    if keys:
        batches.append(PlannedBatch(len(batches), tuple(keys), tuple(tokens)))
    return batches


def approximate_tokens(prompt: PromptLine) -> int:
    """A length estimate from characters, good enough to sort and cut batches."""
    return 1 + len(prompt.text) // CHARACTERS_PER_TOKEN


def token_counter(model_dir: Path) -> Callable[[PromptLine], int] | None:
    """Exact prompt lengths from the model's tokenizer.json (chat markup not counted); None without one."""
    path = model_dir / "tokenizer.json"
    if not path.is_file():
        return None
    from tokenizers import Tokenizer

    try:
        tokenizer = Tokenizer.from_file(str(path))
    except Exception:  # a tokenizer this library version cannot read: plan by estimate instead
        return None

    def count(prompt: PromptLine) -> int:
        return len(tokenizer.encode(prompt.text).ids)

    return count
