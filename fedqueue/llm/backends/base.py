"""What differs between LLM backends: a worker's load and generate, and what submitting a job needs to know."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fedqueue.llm.generate import BatchStats, Generation, PromptIn
    from fedqueue.llm.model import LoadedModel
    from fedqueue.llm.model_files import ModelFacts
    from fedqueue.llm.settings import GenerationSettings


class LlmBackend(ABC):
    """One way of generating: its name (`--backend NAME`), how a worker loads a model and generates a batch with
    it, and what the submitting side plans and checks by. Import-light: engines load in `load` and `generate`."""

    name: str
    # Its batches are padded to their longest prompt, so planning keeps their padding low; a backend that pads
    # nothing (paged attention) has its batches cut by size and slots alone.
    pads_batches: bool = True
    # A worker reads a GGUF file through this host's model cache (converted once per host), so a submit that
    # starts the workers here starts converting it at once.
    uses_model_cache: bool = True
    # What to install where `missing_here` says it is missing.
    install_hint: str = ""

    def missing_here(self) -> str | None:
        """Why this Python environment cannot run the backend (a package not installed), or None."""
        return None

    def runs_config_context(self, facts: ModelFacts) -> bool:
        """Whether a model runs with the context its config states, so that a prompt past it can be refused at
        submit; False where the backend decides that on the worker."""
        return True

    @abstractmethod
    def load(self, name: str, dtype: str, cache: Path | None) -> LoadedModel:
        """The model `name` in this worker process (`cache`: this host's model cache, for a GGUF file)."""

    @abstractmethod
    def generate(
        self, loaded: LoadedModel, prompts: Sequence[PromptIn], settings: GenerationSettings
    ) -> tuple[list[Generation], BatchStats]:
        """One Generation per prompt, in the order given; a prompt that cannot run gets an error row."""
