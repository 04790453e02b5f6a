"""The LLM job kind's table: one row per prompt. It shares the core's declarative base (runs are the core's);
the LLM migration branch changes it."""

from __future__ import annotations

from typing import Any

from sqlalchemy import JSON, Float, ForeignKey, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from fedqueue.store.schema import Base


class LlmPromptRow(Base):
    """One prompt of an LLM batch job (a run of kind "llm") and, once generated, its output."""

    __tablename__ = "llm_prompts"
    # One row per input id: a batch delivered twice, or a job submitted again, writes each row once.
    __table_args__ = (UniqueConstraint("run_id", "key", name="uq_llm_prompts_key"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), index=True)
    key: Mapped[str] = mapped_column(String(300))  # the input id made unique within the job
    input_id: Mapped[Any] = mapped_column(JSON, nullable=True)  # the id as the input gave it, for export
    line: Mapped[int] = mapped_column(Integer)
    prompt_sha256: Mapped[str] = mapped_column(String(64))
    prompt: Mapped[str | None] = mapped_column(Text, nullable=True)
    messages: Mapped[Any] = mapped_column(JSON, nullable=True)  # [[role, content], ...] for chat models
    # An identical prompt generated once: this row copies the output of the row with that key.
    same_as: Mapped[str | None] = mapped_column(String(300), nullable=True)
    state: Mapped[str] = mapped_column(String(16))  # pending | done | failed
    batch: Mapped[int | None] = mapped_column(Integer, nullable=True)
    output: Mapped[str | None] = mapped_column(Text, nullable=True)
    prompt_tokens: Mapped[int | None] = mapped_column(Integer, nullable=True)
    generated_tokens: Mapped[int | None] = mapped_column(Integer, nullable=True)
    finish_reason: Mapped[str | None] = mapped_column(String(16), nullable=True)  # stop | length
    worker: Mapped[str | None] = mapped_column(String(200), nullable=True)
    latency_ms: Mapped[float | None] = mapped_column(Float, nullable=True)  # its batch's generation time
    finished_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    error: Mapped[str | None] = mapped_column(Text, nullable=True)


class PipelineItemRow(Base):
    """One item of an LLM pipeline (a run of kind "llm" whose config names a program): its input and, once its
    program returned or failed, its result or error. Its calls are PipelineCallRow rows."""

    __tablename__ = "llm_pipeline_items"
    __table_args__ = (UniqueConstraint("run_id", "key", name="uq_llm_pipeline_items_key"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), index=True)
    key: Mapped[str] = mapped_column(String(300))
    input_id: Mapped[Any] = mapped_column(JSON, nullable=True)
    line: Mapped[int] = mapped_column(Integer)
    item: Mapped[Any] = mapped_column(JSON, nullable=True)  # what the program is given
    state: Mapped[str] = mapped_column(String(16))  # running | done | failed
    steps: Mapped[int] = mapped_column(Integer, default=0)  # calls stored
    result: Mapped[Any] = mapped_column(JSON, nullable=True)
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    finished_at: Mapped[float | None] = mapped_column(Float, nullable=True)


class PipelineCallRow(Base):
    """One step of a pipeline item: the request its program yielded and, once generated, the output. Written
    once per (item, step): a step stored is never generated again."""

    __tablename__ = "llm_pipeline_calls"
    __table_args__ = (UniqueConstraint("run_id", "item_key", "step", name="uq_llm_pipeline_calls_step"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), index=True)
    item_key: Mapped[str] = mapped_column(String(300))
    step: Mapped[int] = mapped_column(Integer)
    request: Mapped[Any] = mapped_column(JSON)  # Generate.to_dict()
    length: Mapped[int] = mapped_column(Integer)  # the prompt's estimated tokens: calls are batched by it
    # The request's own decoding settings as JSON ("{}": the pipeline's): a batch takes calls of one kind only.
    settings: Mapped[str] = mapped_column(String(200))
    state: Mapped[str] = mapped_column(String(16))  # pending | claimed | done | failed
    lane: Mapped[int | None] = mapped_column(Integer, nullable=True)  # the lane that claimed it
    output: Mapped[str | None] = mapped_column(Text, nullable=True)
    prompt_tokens: Mapped[int | None] = mapped_column(Integer, nullable=True)
    generated_tokens: Mapped[int | None] = mapped_column(Integer, nullable=True)
    finish_reason: Mapped[str | None] = mapped_column(String(16), nullable=True)
    worker: Mapped[str | None] = mapped_column(String(200), nullable=True)
    finished_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    error: Mapped[str | None] = mapped_column(Text, nullable=True)


class PipelineLaneRow(Base):
    """One lane of a pipeline: a chain of tasks, each taking a batch of pending calls. `seq` is the task the lane
    is at; storing a batch moves it on in the same transaction, so a task delivered twice stores once."""

    __tablename__ = "llm_pipeline_lanes"

    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True)
    lane: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    seq: Mapped[int] = mapped_column(Integer)
