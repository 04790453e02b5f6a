"""One item's program run alone in this process, one call at a time, each a one-prompt generate: what a pipeline
gives each item (greedy decoding), and a way to try a program on a few items before submitting it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fedqueue.llm.model import LoadedModel
from fedqueue.llm.pipelines.program import Program
from fedqueue.llm.pipelines.replay import DEFAULT_MAX_STEPS, Failed, NextCall, advance
from fedqueue.llm.settings import GenerationSettings


@dataclass(frozen=True)
class Trace:
    steps: list[tuple[dict[str, Any], str | None]]  # (request, output) of each call
    result: Any = None
    error: str | None = None


def run_alone(
    loaded: LoadedModel,
    program: Program,
    item: Any,
    generation: GenerationSettings,
    key: str,
    max_steps: int = DEFAULT_MAX_STEPS,
) -> Trace:
    """The item's calls, each generated alone (seeded by `key` and its step, as a pipeline seeds them)."""
    from fedqueue.llm.generate import PromptIn, generate_batch

    steps: list[tuple[dict[str, Any], str | None]] = []
    while True:
        found = advance(program, item, [str(output) for _, output in steps], max_steps)
        if not isinstance(found, NextCall):
            if isinstance(found, Failed):
                return Trace(steps, error=found.error)
            return Trace(steps, result=found.result)
        request = found.request
        prompt = PromptIn(key=f"{key}#{found.step}", prompt=request.prompt, messages=request.pairs)
        [generation_out], _ = generate_batch(loaded, [prompt], request.settings(generation))
        if generation_out.error is not None:
            return Trace(steps, error=f"step {found.step}: generation failed: {generation_out.error}")
        steps.append((request.to_dict(), generation_out.output))
