"""Cutting a job's prompts into batches: each prompt generated once, similar lengths together.

A batch pads every prompt to its longest, so batches are cut from the prompts sorted longest
first: little padding, and the batch most likely to run out of memory runs first, where the
worker learns the size that fits. Batches hold equal shares of the job's tokens, as many as a
multiple of the worker slots, so every slot is busy until the end. Pure and deterministic: the
same prompts and slot count give the same plan. No torch here.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from itertools import accumulate, pairwise
from pathlib import Path
from typing import Any

from fedqueue.errors import ConfigError
from fedqueue.llm.prompts import PromptLine

CHARACTERS_PER_TOKEN = 4  # a rough English average, for models without a tokenizer.json
MAX_PAD_FRACTION = 0.10  # most of a job's prompt positions a plan may spend on padding
DEFAULT_SLOTS = 4  # slots planned for when none can be learned: balanced on 1, 2 or 4 of them


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
    slots: int = 1,
    max_pad_fraction: float = MAX_PAD_FRACTION,
) -> list[PlannedBatch]:
    """Batches of (key, prompt tokens), longest first, numbered from 0, sized for `slots` workers at once.

    The prompts, sorted longest first, are cut where each batch holds an equal share of the job's
    tokens (prompt + max_new_tokens per prompt), into a multiple of `slots` batches: every slot takes
    the same number of equal batches, so none waits idle at the end. The fewest batches are used
    that keep at most `batch_size` prompts and, with `max_batch_tokens`, at most that many tokens
    once padded (prompts x (longest + max_new_tokens)) in each batch, and padding over the whole job
    at most `max_pad_fraction` of the prompt positions. A prompt too long for the token budget on
    its own still gets a batch of one: the worker decides whether it fits.
    """
    check_limits(batch_size, max_batch_tokens, slots)
    ordered = sorted(lengths, key=lambda item: -item[1])  # stable: equal lengths keep input order
    if not ordered:
        return []
    weights = [length + max_new_tokens for _, length in ordered]
    tokens = [length for _, length in ordered]

    def fits(bounds: list[int]) -> bool:
        groups = list(pairwise(bounds))
        padded = sum((end - start) * tokens[start] for start, end in groups)  # sorted: a batch's first is longest
        for start, end in groups:
            rows = end - start
            if batch_size is not None and rows > batch_size:
                return False
            if max_batch_tokens is not None and rows > 1 and rows * weights[start] > max_batch_tokens:
                return False
        return padded == 0 or sum(tokens) >= (1 - max_pad_fraction) * padded

    def cut(count: int) -> list[int]:
        floor = 0 if batch_size is None else _weight_floor(weights, count * batch_size)
        return _equal_cuts([max(weight, floor) for weight in weights], count)

    first = _fewest_batches(weights, batch_size, max_batch_tokens, slots)
    bounds = _smallest_fitting(first, slots, len(ordered), cut, fits)
    return [
        PlannedBatch(
            index,
            tuple(key for key, _ in ordered[start:end]),
            tuple(tokens[start:end]),
        )
        for index, (start, end) in enumerate(pairwise(bounds))
    ]


def check_limits(batch_size: int | None, max_batch_tokens: int | None, slots: int = 1) -> None:
    if batch_size is None and max_batch_tokens is None:
        raise ConfigError("--batch-size or --max-batch-tokens: give at least one")
    if batch_size is not None and batch_size < 1:
        raise ConfigError(f"--batch-size: must be at least 1, got {batch_size}")
    if max_batch_tokens is not None and max_batch_tokens < 1:
        raise ConfigError(f"--max-batch-tokens: must be at least 1, got {max_batch_tokens}")
    if slots < 1:
        raise ConfigError(f"slots: must be at least 1, got {slots}")


def _fewest_batches(weights: Sequence[int], batch_size: int | None, max_batch_tokens: int | None, slots: int) -> int:
    """A lower bound on the batch count: the size cap, the token budget, and one batch per slot, rounded up to
    a multiple of `slots` (never more batches than prompts)."""
    count = max(1, slots)
    if batch_size is not None:
        count = max(count, -(-len(weights) // batch_size))
    if max_batch_tokens is not None:
        count = max(count, -(-sum(weights) // max_batch_tokens))
    return min(len(weights), -(-count // slots) * slots)


def _smallest_fitting(
    first: int, step: int, most: int, cut: Callable[[int], list[int]], fits: Callable[[list[int]], bool]
) -> list[int]:
    """The cut for the smallest count in first, first + step, ... (at most `most`) that fits.

    Counts are tried doubling the distance, then bisected: a few cuts even for a job of 100,000
    prompts. `most` (a batch per prompt) always fits, so a plan is always found.
    """

    def count_at(position: int) -> int:
        return min(first + position * step, most)

    best = cut(count_at(0))
    if fits(best):
        return best
    failing, position = 0, 1
    while True:
        best = cut(count_at(position))
        if fits(best):
            break
        failing, position = position, 2 * position
    passing = position
    while passing - failing > 1:
        middle = (failing + passing) // 2
        bounds = cut(count_at(middle))
        if fits(bounds):
            passing, best = middle, bounds
        else:
            failing = middle
    return best


def _weight_floor(weights: Sequence[int], rows: int) -> int:
    """The least weight F such that `rows` prompts of weight F hold every weight raised to F.

    Short prompts weigh at least F in the cut, so an equal share never holds more than about
    rows / count prompts: where --batch-size binds, short prompts' batches hold fewer tokens
    (they come last, and slots still end within one small batch) instead of long prompts'
    batches shrinking to a few rows each. 0 where the cap does not bind.
    """
    ascending = sorted(weights)
    below = [0, *accumulate(ascending)]

    def raised_total(floor: int) -> int:
        under = bisect_left(ascending, floor)
        return below[-1] - below[under] + under * floor

    low, high = 0, ascending[-1] if ascending else 0
    while low < high:
        middle = (low + high) // 2
        if rows * middle >= raised_total(middle):
            high = middle
        else:
            low = middle + 1
    return low if low > ascending[0] else 0


def _equal_cuts(weights: Sequence[int], count: int) -> list[int]:
    """Boundaries (0, ..., len) of `count` runs of `weights` with sums as equal as whole items allow.

    Cut i falls on the prefix sum nearest i/count of the total, so each run is within one item of
    total/count; every run keeps at least one item. Integer arithmetic: the same plan on every machine.
    """
    prefix = [0, *accumulate(weights)]
    total, size = prefix[-1], len(weights)
    bounds = [0]
    for cut in range(1, count):
        goal = cut * total  # compared with count * prefix[j], all in integers
        j = bisect_left(prefix, goal, key=lambda value: value * count)
        if j > 0 and goal - count * prefix[j - 1] < count * prefix[j] - goal:
            j -= 1
        bounds.append(min(max(j, bounds[-1] + 1), size - (count - cut)))
    bounds.append(size)
    return bounds


def approximate_tokens(prompt: PromptLine) -> int:
    """A length estimate from characters, good enough to sort and cut batches."""
    return 1 + len(prompt.text) // CHARACTERS_PER_TOKEN


def token_counter(model_dir: Path) -> Callable[[PromptLine], int] | None:
    """Exact prompt lengths from the model's tokenizer.json (chat markup not counted); None without one."""
    tokenizer = load_tokenizer(model_dir / "tokenizer.json")
    if tokenizer is None:
        return None

    def count(prompt: PromptLine) -> int:
        return len(tokenizer.encode(prompt.text).ids)

    return count


def load_tokenizer(path: Path) -> Any | None:
    """A `tokenizers` Tokenizer from a tokenizer.json (read once per file and version); None where there is
    none, or this library version cannot read it (prompts are then planned by estimate)."""
    try:
        stamp = path.stat().st_mtime_ns
    except OSError:
        return None
    return _load_tokenizer(str(path), stamp)


@lru_cache(maxsize=4)
def _load_tokenizer(path: str, stamp: int) -> Any | None:
    from tokenizers import Tokenizer

    try:
        return Tokenizer.from_file(path)
    except Exception:  # a tokenizer this library version cannot read
        return None
