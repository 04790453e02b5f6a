"""vLLM (`--backend vllm`): its engine inside the worker (vllm_engine.py), where it is installed."""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from fedqueue.llm.backends.base import LlmBackend

if TYPE_CHECKING:
    from fedqueue.llm.generate import BatchStats, Generation, PromptIn
    from fedqueue.llm.model import LoadedModel
    from fedqueue.llm.model_files import ModelFacts
    from fedqueue.llm.settings import GenerationSettings


class VllmBackend(LlmBackend):
    name = "vllm"
    # vLLM schedules its own batches with paged attention: a batch needs no padding.
    pads_batches = False
    # vLLM loads a model by its name or folder itself.
    uses_model_cache = False
    install_hint = "pip install 'fedqueue[vllm]', or make vllm"

    def missing_here(self) -> str | None:
        return None if importlib.util.find_spec("vllm") is not None else "vllm is not installed here"

    def runs_config_context(self, facts: ModelFacts) -> bool:
        # vLLM stretches a scaled RoPE's context past the config's.
        return not facts.scaled_context

    # vLLM and torch: imported by a worker's batch, never by the submitting side.
    def load(self, name: str, dtype: str, cache: Path | None) -> LoadedModel:
        from fedqueue.llm.backends.vllm_engine import load_vllm

        return load_vllm(name, dtype)

    def generate(
        self, loaded: LoadedModel, prompts: Sequence[PromptIn], settings: GenerationSettings
    ) -> tuple[list[Generation], BatchStats]:
        from fedqueue.llm.backends.vllm_engine import generate_vllm

        return generate_vllm(loaded, prompts, settings)
