"""Generating one batch of prompts with a loaded model: left-padded batched `generate()`, one result per prompt.

A prompt that cannot run (too long, no chat template, a failure of its own) gets an error row and the others
go on. Running out of GPU memory halves the batch until it fits, and the model remembers the size that did.
"""

from __future__ import annotations

import gc
import hashlib
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from transformers import LogitsProcessor, LogitsProcessorList

from fedqueue.llm.model import LoadedModel
from fedqueue.llm.settings import GenerationSettings

SEED_MODULUS = 2**63


@dataclass(frozen=True)
class PromptIn:
    """One prompt: plain text, or chat messages as (role, content) pairs rendered by the model's chat template."""

    key: str
    prompt: str | None = None
    messages: tuple[tuple[str, str], ...] | None = None


@dataclass(frozen=True)
class Generation:
    """What one prompt produced, or why it produced nothing (`error`)."""

    key: str
    output: str | None
    prompt_tokens: int
    generated_tokens: int
    finish_reason: str | None  # "stop": the model ended it; "length": max_new_tokens was reached
    error: str | None = None


@dataclass(frozen=True)
class BatchStats:
    """How a batch ran. Token sums cover the sub-batches that completed (a prompt retried alone counts there)."""

    prompts: int
    prompt_tokens: int
    padded_prompt_tokens: int  # rows x longest prompt, summed over the sub-batches that completed
    generated_tokens: int
    batch_sizes_run: tuple[int, ...]

    @property
    def pad_fraction(self) -> float:
        if self.padded_prompt_tokens == 0:
            return 0.0
        return 1.0 - self.prompt_tokens / self.padded_prompt_tokens


@dataclass(frozen=True)
class _Encoded:
    index: int  # position in the caller's list
    key: str
    ids: tuple[int, ...]


class _OutOfMemory:
    """A sub-batch's generate ran out of device memory (returned, not raised, so no frames hold tensors)."""


OUT_OF_MEMORY = _OutOfMemory()


def generate_batch(
    loaded: LoadedModel, prompts: Sequence[PromptIn], settings: GenerationSettings
) -> tuple[list[Generation], BatchStats]:
    """One Generation per prompt, in the order given; prompts run in length order to keep padding low."""
    results: dict[int, Generation] = {}
    ready: list[_Encoded] = []
    for index, prompt in enumerate(prompts):
        encoded = encode_prompt(loaded, prompt)
        if isinstance(encoded, str):
            results[index] = _failed(prompt.key, encoded, 0)
            continue
        if len(encoded) + settings.max_new_tokens > loaded.context_length:
            message = (
                f"prompt has {len(encoded)} tokens; with max_new_tokens {settings.max_new_tokens} "
                f"it exceeds the model's context of {loaded.context_length}"
            )
            results[index] = _failed(prompt.key, message, len(encoded))
            continue
        ready.append(_Encoded(index, prompt.key, encoded))

    runner = _Runner(loaded, settings)
    results.update(runner.run(sorted(ready, key=lambda item: (len(item.ids), item.index))))
    generations = [results[index] for index in range(len(prompts))]
    stats = BatchStats(
        prompts=len(prompts),
        prompt_tokens=runner.prompt_tokens,
        padded_prompt_tokens=runner.padded_tokens,
        generated_tokens=sum(generation.generated_tokens for generation in generations),
        batch_sizes_run=tuple(runner.sizes),
    )
    return generations, stats


def prompt_seed(seed: int, key: str) -> int:
    """A prompt's own sampling seed: the job's seed moved by a stable hash of the prompt's key."""
    digest = int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big")
    return (seed + digest) % SEED_MODULUS


class _Runner:
    """Runs sorted prompts in sub-batches, splitting on out-of-memory and isolating failing prompts."""

    def __init__(self, loaded: LoadedModel, settings: GenerationSettings) -> None:
        self.loaded = loaded
        self.settings = settings
        self.eos_ids = _eos_ids(loaded)
        self.sizes: list[int] = []
        self.prompt_tokens = 0
        self.padded_tokens = 0

    def run(self, items: list[_Encoded]) -> dict[int, Generation]:
        results: dict[int, Generation] = {}
        pending: deque[list[_Encoded]] = deque([items] if items else [])
        while pending:
            group = pending.popleft()
            cap = self.loaded.max_batch
            if cap is not None and len(group) > cap:
                pending.extendleft(reversed(_chunks(group, cap)))
                continue
            outcome = self._attempt(group)
            if isinstance(outcome, list):
                self._count(group)
                results.update((item.index, generation) for item, generation in zip(group, outcome, strict=True))
            elif outcome is OUT_OF_MEMORY:
                self._free_memory()
                if len(group) == 1:
                    message = (
                        f"out of memory on {self.loaded.device} for this prompt alone "
                        f"({len(group[0].ids)} tokens, max_new_tokens {self.settings.max_new_tokens})"
                    )
                    results[group[0].index] = _failed(group[0].key, message, len(group[0].ids))
                else:
                    # Later batches on this model start at the size tried next, not at the full size. Another
                    # thread sharing the model may have lowered it meanwhile: never raise it.
                    half = (len(group) + 1) // 2
                    current = self.loaded.max_batch
                    self.loaded.max_batch = half if current is None else min(current, half)
                    pending.appendleft(group)
            elif len(group) == 1:
                results[group[0].index] = _failed(group[0].key, str(outcome), len(group[0].ids))
            else:
                # One prompt may be at fault: run each alone so only its own row fails.
                pending.extendleft([item] for item in reversed(group))
        return results

    def _attempt(self, group: list[_Encoded]) -> list[Generation] | _OutOfMemory | str:
        try:
            return self._generate(group)
        except torch.OutOfMemoryError:
            return OUT_OF_MEMORY
        except Exception as error:
            return _one_line(error)

    def _generate(self, group: list[_Encoded]) -> list[Generation]:
        tokenizer, settings = self.loaded.tokenizer, self.settings
        width = max(len(item.ids) for item in group)
        input_ids = torch.full((len(group), width), tokenizer.pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros((len(group), width), dtype=torch.long)
        for row, item in enumerate(group):
            # Left padding: every row's last prompt token sits in the last column, where generation starts.
            input_ids[row, width - len(item.ids) :] = torch.tensor(item.ids, dtype=torch.long)
            attention_mask[row, width - len(item.ids) :] = 1
        processors = LogitsProcessorList()
        if not settings.greedy:
            seeds = [prompt_seed(settings.seed, item.key) for item in group]
            processors.append(_SeededSampler(seeds, settings.temperature, settings.top_p))
        with torch.inference_mode():
            output = self.loaded.model.generate(
                input_ids=input_ids.to(self.loaded.device),
                attention_mask=attention_mask.to(self.loaded.device),
                max_new_tokens=settings.max_new_tokens,
                do_sample=False,  # sampling, when asked for, is done by the seeded processor
                pad_token_id=tokenizer.pad_token_id,
                eos_token_id=sorted(self.eos_ids) or None,
                logits_processor=processors,
            )
        rows = output[:, width:].tolist()
        return [self._finish(item, row) for item, row in zip(group, rows, strict=True)]

    def _finish(self, item: _Encoded, new_ids: list[int]) -> Generation:
        """Cut a row at its first end-of-sequence token: what follows is padding for rows still running."""
        stop = next((position for position, token in enumerate(new_ids) if token in self.eos_ids), None)
        kept = new_ids if stop is None else new_ids[:stop]
        text = self.loaded.tokenizer.decode(kept, skip_special_tokens=True)
        return Generation(
            key=item.key,
            output=text,
            prompt_tokens=len(item.ids),
            generated_tokens=len(new_ids) if stop is None else stop + 1,
            finish_reason="length" if stop is None else "stop",
        )

    def _count(self, group: list[_Encoded]) -> None:
        self.sizes.append(len(group))
        self.prompt_tokens += sum(len(item.ids) for item in group)
        self.padded_tokens += len(group) * max(len(item.ids) for item in group)

    def _free_memory(self) -> None:
        gc.collect()
        if self.loaded.device.type == "cuda":
            torch.cuda.empty_cache()


class _SeededSampler(LogitsProcessor):
    """Samples each row from its own generator and leaves only that token, so greedy selection picks it.

    A row's draws depend on its seed and its own logits alone, never on the other rows of the batch.
    """

    def __init__(self, seeds: list[int], temperature: float, top_p: float) -> None:
        self.seeds = seeds
        self.temperature = temperature
        self.top_p = top_p
        self.generators: list[torch.Generator] = []

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if not self.generators:
            self.generators = [torch.Generator(device=scores.device).manual_seed(seed) for seed in self.seeds]
        probs = torch.softmax(scores.float() / self.temperature, dim=-1)
        if self.top_p < 1.0:
            probs = _nucleus(probs, self.top_p)
        chosen = torch.cat(
            [torch.multinomial(probs[row], 1, generator=generator) for row, generator in enumerate(self.generators)]
        )
        only = torch.full_like(scores, float("-inf"))
        return only.scatter_(1, chosen.unsqueeze(1), 0.0)


def _nucleus(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Zero the tokens outside the smallest set whose probability reaches top_p (the most likely always stays)."""
    ordered, order = probs.sort(dim=-1, descending=True)
    before = ordered.cumsum(dim=-1) - ordered
    ordered = ordered.masked_fill(before >= top_p, 0.0)
    return torch.zeros_like(probs).scatter_(-1, order, ordered)


def encode_prompt(loaded: LoadedModel, prompt: PromptIn) -> tuple[int, ...] | str:
    """The prompt's token ids, or why it cannot run."""
    tokenizer = loaded.tokenizer
    if (prompt.prompt is None) == (prompt.messages is None):
        return "a prompt needs exactly one of prompt or messages"
    try:
        if prompt.messages is not None:
            if not getattr(tokenizer, "chat_template", None):
                return f"model {loaded.name} has no chat template; give a plain prompt instead of messages"
            conversation = [{"role": role, "content": content} for role, content in prompt.messages]
            text = tokenizer.apply_chat_template(conversation, tokenize=False, add_generation_prompt=True)
            # The template writes the special tokens it wants itself.
            ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        else:
            ids = tokenizer(prompt.prompt)["input_ids"]
    except Exception as error:
        return f"cannot tokenize: {_one_line(error)}"
    if not ids:
        return "prompt is empty"
    return tuple(int(token) for token in ids)


def _eos_ids(loaded: LoadedModel) -> frozenset[int]:
    """The model's end-of-sequence ids: its generation config's (one or several), else the tokenizer's."""
    configured = getattr(getattr(loaded.model, "generation_config", None), "eos_token_id", None)
    if configured is None:
        configured = loaded.tokenizer.eos_token_id
    if configured is None:
        return frozenset()
    return frozenset([configured] if isinstance(configured, int) else configured)


def _chunks(items: list[_Encoded], size: int) -> list[list[_Encoded]]:
    return [items[start : start + size] for start in range(0, len(items), size)]


def _failed(key: str, error: str, prompt_tokens: int) -> Generation:
    return Generation(
        key=key, output=None, prompt_tokens=prompt_tokens, generated_tokens=0, finish_reason=None, error=error
    )


def _one_line(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0]}" if lines else type(error).__name__
