"""LLM backends by name: a job refuses one not installed before anything is read, and a backend registered beside
the two that ship is planned for and generated with through the same submit and worker code."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
import torch

from fedqueue.config import Settings
from fedqueue.core.broker.memory import RecordingEnqueuer, memory_services
from fedqueue.core.database import open_store
from fedqueue.errors import ConfigError
from fedqueue.llm.backends import registry
from fedqueue.llm.backends.base import LlmBackend
from fedqueue.llm.backends.vllm import VllmBackend
from fedqueue.llm.context import too_long
from fedqueue.llm.generate import BatchStats, Generation, PromptIn
from fedqueue.llm.job import JobRequest, check_request, submit_job
from fedqueue.llm.messages import GenerateBatch
from fedqueue.llm.model import LoadedModel
from fedqueue.llm.model_files import model_facts
from fedqueue.llm.prompts import PromptLine
from fedqueue.llm.results import prompt_rows
from fedqueue.llm.settings import GenerationSettings
from fedqueue.llm.worker import ModelCache, run_batch


class Reverser(LlmBackend):
    """A backend of no engine: each prompt's output is its text reversed; it pads nothing."""

    name = "reverser"
    pads_batches = False
    uses_model_cache = False

    def __init__(self) -> None:
        self.loads: list[tuple[str, str]] = []
        self.batches: list[int] = []

    def load(self, name: str, dtype: str, cache: Path | None) -> LoadedModel:
        self.loads.append((name, dtype))
        cpu = torch.device("cpu")
        return LoadedModel(model=None, tokenizer=None, device=cpu, dtype=torch.float32, context_length=1, name=name)

    def generate(
        self, loaded: LoadedModel, prompts: Sequence[PromptIn], settings: GenerationSettings
    ) -> tuple[list[Generation], BatchStats]:
        self.batches.append(len(prompts))
        rows = [Generation(prompt.key, (prompt.prompt or "")[::-1], 1, 1, "stop") for prompt in prompts]
        return rows, BatchStats(len(rows), len(rows), len(rows), len(rows), (len(rows),))


@pytest.fixture
def reverser(monkeypatch: pytest.MonkeyPatch) -> Iterator[Reverser]:
    """Registered for one test: the shipped backends stay, this one goes afterwards."""
    monkeypatch.setattr(registry, "_backends", dict(registry._backends))
    backend = Reverser()
    registry.register(backend)
    yield backend


def write_prompts(path: Path) -> Path:
    """One long prompt and many short ones: a batch of them all is mostly padding."""
    texts = ["word " * 30, *(f"q{index}" for index in range(23))]
    path.write_text("".join(json.dumps({"id": f"p{index}", "prompt": text}) + "\n" for index, text in enumerate(texts)))
    return path


def test_a_registered_backend_is_planned_for_and_generates_through_the_worker(
    reverser: Reverser, tmp_path: Path, tiny_model_path: Path
) -> None:
    settings = Settings(database_url=f"sqlite:///{tmp_path / 'jobs.db'}", model_cache=str(tmp_path / "cache"))
    store = open_store(settings.database_url, migrate=True)
    services = memory_services(settings, store)
    sent = services.enqueue
    assert isinstance(sent, RecordingEnqueuer)
    input_path = write_prompts(tmp_path / "prompts.jsonl")

    def batches(backend: str) -> int:
        generation = GenerationSettings(max_new_tokens=4, backend=backend)
        request = JobRequest(input_path, str(tiny_model_path), generation, batch_size=64, slots=1)
        return len(submit_job(services, request).batches)

    # Padded batches keep the long prompt apart; a backend that pads nothing is planned as vLLM is: one batch.
    assert batches("transformers") > 1 and (batches("vllm"), batches("reverser")) == (1, 1)
    job_id = sent.of_type(GenerateBatch)[-1].run_id
    tasks = [task for task in sent.take() if task.run_id == job_id]

    cache = ModelCache()
    for task in tasks:
        run_batch(services, cache, task, "w1", 1)

    assert reverser.loads == [(str(tiny_model_path), "auto")] and reverser.batches == [24]
    rows = prompt_rows(store, job_id)
    assert [(row.state, row.output) for row in rows] == [("done", (row.prompt or "")[::-1]) for row in rows]
    assert len(rows) == 24 and store.get_run(job_id).state == "finished"
    store.close()


def test_a_job_naming_a_backend_not_installed_is_refused_before_its_input_is_read(tmp_path: Path) -> None:
    generation = GenerationSettings(backend="onnx")  # plain data: the name is the registry's to check
    with pytest.raises(ConfigError, match="^backend: must be one of transformers, vllm$"):
        check_request(JobRequest(tmp_path / "missing.jsonl", "any-model", generation))


def test_vllm_leaves_a_scaled_context_to_the_worker(tiny_model_path: Path) -> None:
    facts = model_facts(str(tiny_model_path))
    prompt = PromptLine(key="p", input_id="p", line=1, prompt="word " * 400)
    vllm = registry.get("vllm")
    assert isinstance(vllm, VllmBackend) and vllm.runs_config_context(facts)
    assert len(too_long([prompt], facts, 8, vllm)) == 1  # the config's context is the one it runs with
    scaled = dataclasses.replace(facts, scaled_context=True)
    assert too_long([prompt], scaled, 8, vllm) == []
    assert len(too_long([prompt], scaled, 8, registry.get("transformers"))) == 1
