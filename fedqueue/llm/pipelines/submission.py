"""A pipeline as a Submission of the kind-neutral API, and its checks before any worker starts.

`fedqueue llm pipeline` and fedqueue.llm.pipeline() both submit through here; they differ only in how they
name a field at fault (`--program` or `program`) and where warnings go.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, replace

from fedqueue.config import Settings
from fedqueue.core.database import open_store
from fedqueue.core.services import Services
from fedqueue.llm.backends import registry as backends
from fedqueue.llm.pipelines.submit import PipelineRequest, SubmittedPipeline, check_pipeline, submit_pipeline
from fedqueue.llm.slots import answering_slots_later, slots_answered
from fedqueue.llm.submission import Option, Warn, check_backend, check_model_here, python_warning, same_name


@dataclass
class PipelineSubmission:
    request: PipelineRequest
    announce: Callable[[SubmittedPipeline], object] | None = None
    warn: Warn = python_warning
    option: Option = same_name
    submitted: SubmittedPipeline | None = None
    # The LLM slots of the workers on a configured broker (one lane each), asked while the rest is checked; None
    # where lanes are given or the workers' slots are known (started here or by `fedqueue up`).
    answering: Future[int | None] | None = None

    def check_before_start(self, settings: Settings) -> None:
        """A program that does not import, bad limits or a bad item line: refused before anything starts."""
        check_pipeline(self.request, self.option)
        if settings.broker_url and self.request.lanes is None and self.answering is None:
            self.answering = answering_slots_later(settings)  # the workers answer while this process goes on

    def check(self, settings: Settings) -> None:
        check_pipeline(self.request, self.option)
        workers_here = not settings.broker_url
        check_backend(backends.get(self.request.generation.backend), workers_here, self.warn, self.option)
        check_model_here(self.request.model, workers_here, self.warn, self.option)
        if workers_here:
            open_store(settings.database_url, migrate=True).close()  # a bad database before any worker starts

    def submit(self, services: Services) -> str:
        if self.request.lanes is not None:
            lanes: int | None = self.request.lanes
        elif self.answering is not None:
            lanes = slots_answered(self.answering, self.warn)
        else:  # workers started here or by `fedqueue up`: their slots are known
            lanes = sum(services.worker_slots().values()) or None
        self.submitted = submit_pipeline(services, replace(self.request, lanes=lanes))
        if self.announce is not None:
            self.announce(self.submitted)
        return self.submitted.job_id
