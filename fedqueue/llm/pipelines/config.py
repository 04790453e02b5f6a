"""A pipeline's settings as its run row keeps them, read back the same way by the submitter and the workers."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedqueue.llm.pipelines.request import Generate
from fedqueue.llm.planner import CHARACTERS_PER_TOKEN, load_tokenizer
from fedqueue.llm.settings import GenerationSettings


@dataclass(frozen=True)
class PipelineConfig:
    program: str
    model: str
    generation: GenerationSettings
    max_steps: int
    batch_size: int
    lanes: int

    @classmethod
    def of_run(cls, config: dict[str, Any]) -> PipelineConfig:
        return cls(
            program=config["program"],
            model=config["model"],
            generation=GenerationSettings.from_dict(config["generation"]),
            max_steps=int(config["max_steps"]),
            batch_size=int(config["batch_size"]),
            lanes=int(config["lanes"]),
        )

    def length(self, request: Generate) -> int:
        """The request's prompt in tokens, as the model's tokenizer.json counts them, else estimated: calls are
        batched by it."""
        text = request.prompt if request.pairs is None else "\n".join(content for _, content in request.pairs)
        tokenizer = load_tokenizer(Path(self.model) / "tokenizer.json")
        if tokenizer is None:
            return 1 + len(text or "") // CHARACTERS_PER_TOKEN
        return len(tokenizer.encode(text or "").ids)


def is_pipeline(config: dict[str, Any]) -> bool:
    """A run of the LLM kind that runs a program per item, not a batch of prompts."""
    return "program" in config
