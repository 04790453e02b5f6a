"""An LLM batch job as a Submission of the kind-neutral API, and the checks made before any worker starts.

The `fedqueue llm` commands and the Python API (fedqueue.llm.api) both submit through here; they differ
only in how they name a field at fault (`--model` or `model`) and where warnings go.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import warnings
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, replace
from pathlib import Path

from fedqueue.config import Settings
from fedqueue.core.database import open_store
from fedqueue.core.services import Services
from fedqueue.errors import ConfigError
from fedqueue.llm.backends.base import LlmBackend
from fedqueue.llm.converted import convert_in_background
from fedqueue.llm.job import JobRequest, Submitted, check_request, submit_job
from fedqueue.llm.model_files import model_facts, model_folder, model_problem
from fedqueue.llm.prompts import PromptLine
from fedqueue.llm.settings import DEFAULT_BACKEND
from fedqueue.llm.slots import answering_slots_later, slots_answered

Warn = Callable[[str], object]
Option = Callable[[str], str]  # a request field's name as the caller's user knows it


def python_warning(message: str) -> None:
    warnings.warn(message, stacklevel=3)


def same_name(field: str) -> str:
    return field


@dataclass
class JobSubmission:
    """An LLM batch job to submit: its batches are planned for the worker slots that will run them."""

    request: JobRequest
    # The slots of the workers answering on a configured broker, asked while the rest is checked;
    # None where the workers' slots are known (started here or by `fedqueue up`).
    answering: Future[int | None] | None = None
    announce: Callable[[Submitted], object] | None = None
    warn: Warn = python_warning
    submitted: Submitted | None = None  # what the submit did, once it has
    converting: subprocess.Popen[bytes] | None = None  # a GGUF model being converted into this host's model cache

    def check(self, settings: Settings) -> None:
        """The input, the model and the backend were checked before any worker started (`prepare`)."""

    def submit(self, services: Services) -> str:
        if self.answering is not None:
            slots = slots_answered(self.answering, self.warn)
        else:  # workers started here or by `fedqueue up`: their slots are known
            slots = sum(services.worker_slots().values()) or None
        self.submitted = submit_job(services, replace(self.request, slots=slots))
        if self.announce is not None:
            self.announce(self.submitted)
        return self.submitted.job_id


def prepare(
    request: JobRequest, settings: Settings, *, ask_slots: bool, warn: Warn = python_warning, option: Option = same_name
) -> JobSubmission:
    """Check what would fail before anything is written or started, and the submission of `request`.

    With a broker configured the workers may be elsewhere: a model or backend missing here is only a
    warning. `ask_slots`: ask the workers on the broker for their slots while the caller goes on.
    """
    prompts = check_request(request)  # a bad input line or a prompt too long (strict), a limit or job name
    workers_here = not settings.broker_url
    check_backend(request.backend, workers_here, warn, option)
    submission = JobSubmission(request, warn=warn)
    if ask_slots and settings.broker_url:
        submission.answering = answering_slots_later(settings)  # the workers answer while this process goes on
    check_model_here(request.model, workers_here, warn, option)
    if workers_here:
        open_store(settings.database_url, migrate=True).close()  # a bad database before any worker starts
        if request.backend.uses_model_cache:
            # The workers load here: a GGUF file starts converting into the model cache now, while they start and
            # the batches are planned; their first load then waits for it rather than converting its own.
            env = {**os.environ, **settings.to_env()}
            submission.converting = convert_in_background(request.model, request.generation.dtype, env)
    hint = chat_hint(request, prompts, option)
    if hint is not None:
        warn(hint)
    return submission


def chat_hint(request: JobRequest, prompts: list[PromptLine], option: Option = same_name) -> str | None:
    """What to say where a model with a chat template gets plain prompts: an instruction-tuned model may
    answer a bare prompt with nothing (SmolLM2-Instruct does), and nothing else would tell."""
    plain = sum(1 for prompt in prompts if prompt.messages is None)
    if request.chat or plain == 0 or not model_facts(request.model).chat_template:
        return None
    flag = option("chat")
    flag = flag if flag.startswith("-") else f"{flag}=True"
    return (
        f"{option('model')} {request.model} is a chat model (its tokenizer has a chat template) and {plain} of "
        f"{len(prompts)} prompts are plain text, which a chat model may answer with nothing: give them as "
        f'{{"messages": [{{"role": "user", "content": ...}}]}}, or submit with {flag} to send each as a user message'
    )


def model_name(model: str) -> str:
    """A model on disk is named by its absolute path, so workers started elsewhere find it."""
    path = Path(model).expanduser()
    if path.exists():
        return str(path.resolve())
    return model


def check_model_here(model: str, must_exist: bool, warn: Warn = python_warning, option: Option = same_name) -> None:
    """Models are read from local files only: say so now rather than fail every batch on the workers.

    A model that is here must look loadable: a folder with a config, weights and a tokenizer, or a GGUF file
    (and the packages that read one). Workers elsewhere (a broker is configured) may hold a model this machine
    lacks, or another copy of it: then only a warning. A path that is here and holds no model is refused
    wherever the workers are: the workers name the same path.
    """
    problem = model_problem_here(model, needs_readers=must_exist)
    if problem is None:
        return
    if must_exist or Path(model).expanduser().exists():
        raise ConfigError(f"{option('model')} {model}: {problem}")
    warn(f"{option('model')} {model}: {problem}; the workers must have it")


def model_problem_here(model: str, needs_readers: bool = True) -> str | None:
    """Why `model` cannot be loaded from this machine's files, or None. `needs_readers`: a GGUF file needs the
    gguf and accelerate packages here (the workers run here)."""
    path = Path(model)
    if path.exists():
        problem = model_problem(path)
        if problem is None and needs_readers and path.suffix.lower() == ".gguf":
            problem = _gguf_readers_missing()
        return problem
    looks_like_path = model.startswith(("/", ".", "~")) or model.count("/") > 1 or model.endswith(".gguf")
    if looks_like_path:
        return "no such file or directory"
    folder = model_folder(model)
    if folder is None:
        return "not in this machine's Hugging Face cache (models are never downloaded)"
    problem = model_problem(folder)
    return None if problem is None else f"its copy in the Hugging Face cache ({folder}): {problem}"


def _gguf_readers_missing() -> str | None:
    missing = [name for name in ("gguf", "accelerate") if importlib.util.find_spec(name) is None]
    if not missing:
        return None
    return f"reading GGUF files needs {' and '.join(missing)} (pip install 'fedqueue[gguf]')"


def check_backend(
    backend: LlmBackend, workers_here: bool, warn: Warn = python_warning, option: Option = same_name
) -> None:
    """A backend runs on the workers: missing here is fatal only when the workers are started here."""
    problem = backend.missing_here()
    if problem is None:
        return
    if workers_here:
        raise ConfigError(
            f"{option('backend')} {backend.name}: {problem} ({backend.install_hint}); "
            f"use {option('backend')} {DEFAULT_BACKEND}"
        )
    warn(f"{option('backend')} {backend.name}: {problem}; the workers must have it")
