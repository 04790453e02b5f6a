"""The default backend: Hugging Face transformers' batched `generate()`, left-padded (fedqueue.llm.generate)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from fedqueue.core.process.gpus import visible_gpus
from fedqueue.llm.backends.base import LlmBackend

if TYPE_CHECKING:
    from fedqueue.llm.generate import BatchStats, Generation, PromptIn
    from fedqueue.llm.model import LoadedModel
    from fedqueue.llm.settings import GenerationSettings


class TransformersBackend(LlmBackend):
    name = "transformers"

    # torch and transformers: imported by a worker's batch, never by the submitting side.
    def load(self, name: str, dtype: str, cache: Path | None) -> LoadedModel:
        from fedqueue.llm.model import load_model

        return load_model(name, dtype=dtype, device_map=_device_map(), cache=cache)

    def generate(
        self, loaded: LoadedModel, prompts: Sequence[PromptIn], settings: GenerationSettings
    ) -> tuple[list[Generation], BatchStats]:
        from fedqueue.llm.generate import generate_batch

        return generate_batch(loaded, prompts, settings)


def _device_map() -> str | None:
    """A worker pinned to several GPUs spreads a model over them; one GPU or a CPU holds it whole."""
    return "auto" if len(visible_gpus() or []) > 1 else None
