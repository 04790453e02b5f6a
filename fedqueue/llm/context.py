"""Prompts too long for the model's context, found at submit with the model's own tokenizer. No torch here.

A prompt is refused here only where that is certain: its tokens without the ones the tokenizer adds
itself (a bos token), plus max_new_tokens, exceed the context the model's config states. Chat markup
is not counted, so a chat that fits here may still be too long for the worker, which checks again.
Where the tokenizer or the context length is not known here (a GGUF file, a model only the workers
have), every prompt goes to the workers and they decide.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from fedqueue.llm.backends.base import LlmBackend
from fedqueue.llm.model_files import ModelFacts
from fedqueue.llm.planner import load_tokenizer
from fedqueue.llm.prompts import PromptLine

# A tokenizer makes about one token per byte of text at most: a prompt of fewer bytes than the room left, less
# this slack, is not counted (a rare one that does not fit after all is still refused on the worker).
SPECIAL_ROOM = 16


@dataclass(frozen=True)
class TooLong:
    prompt: PromptLine
    tokens: int  # as the tokenizer counts them, its own added tokens included (chat markup not)
    message: str


def too_long(
    prompts: Sequence[PromptLine], facts: ModelFacts, max_new_tokens: int, backend: LlmBackend
) -> list[TooLong]:
    """The prompts that cannot fit the model's context with `max_new_tokens`, in input order."""
    context = facts.context_length
    if context is None or facts.tokenizer_json is None:
        return []
    if not backend.runs_config_context(facts):  # the worker's backend decides
        return []
    tokenizer = load_tokenizer(facts.tokenizer_json)
    if tokenizer is None:
        return []
    added = len(tokenizer.encode("").ids)  # what the tokenizer adds to every text (a bos token, say)
    room = context - max_new_tokens
    found = []
    for prompt in prompts:
        text = prompt.text
        if len(text.encode("utf-8", errors="replace")) + SPECIAL_ROOM <= room:
            continue
        tokens = len(tokenizer.encode(text).ids)
        if tokens - added <= room:
            continue
        if prompt.messages is None:
            message = (
                f"prompt has {tokens} tokens; with max_new_tokens {max_new_tokens} "
                f"it exceeds the model's context of {context}"
            )
        else:
            message = (
                f"messages have {tokens - added} tokens before the chat template's; with max_new_tokens "
                f"{max_new_tokens} they exceed the model's context of {context}"
            )
        found.append(TooLong(prompt, tokens, message))
    return found
