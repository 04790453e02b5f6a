"""Tables. Times are UNIX seconds (float): workers on several hosts compare them directly."""

from __future__ import annotations

from typing import Any

from sqlalchemy import JSON, BigInteger, Float, ForeignKey, Integer, LargeBinary, String, Text, UniqueConstraint
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

NAME_MAX = 200  # longest run name; the run config refuses longer ones
# Byte sizes reach past 2 GiB: 64 bits on Postgres; SQLite's INTEGER already holds 64 bits.
ByteSize = BigInteger().with_variant(Integer(), "sqlite")


class Base(DeclarativeBase):
    pass


class RunRow(Base):
    __tablename__ = "runs"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    # The job kind that owns the run ("fl", "llm"): the supervisor repairs it with that kind's pass.
    kind: Mapped[str] = mapped_column(String(16), default="fl", server_default="fl")
    name: Mapped[str] = mapped_column(String(NAME_MAX), default="")
    config: Mapped[dict[str, Any]] = mapped_column(JSON)
    state: Mapped[str] = mapped_column(String(16))  # running | finished | failed
    rounds_total: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[float] = mapped_column(Float)
    finished_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    # The scheduler process following this run; another one is refused while the lease is live.
    lease_owner: Mapped[str | None] = mapped_column(String(100), nullable=True)
    lease_expires_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    # Redis's run_id when the run last saw its broker: a different one means Redis restarted.
    broker_id: Mapped[str | None] = mapped_column(String(64), nullable=True)


class RoundRow(Base):
    __tablename__ = "rounds"
    __table_args__ = (UniqueConstraint("run_id", "round_index", name="uq_rounds_run_round"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), index=True)
    round_index: Mapped[int] = mapped_column(Integer)
    # The global model version the round trains from (round k trains version k-1).
    version: Mapped[int] = mapped_column(Integer)
    state: Mapped[str] = mapped_column(String(16))  # training | aggregating | done | failed
    selected: Mapped[list[int]] = mapped_column(JSON)
    model_key: Mapped[str] = mapped_column(String(300))
    model_sha256: Mapped[str] = mapped_column(String(64))
    model_nbytes: Mapped[int] = mapped_column(ByteSize)
    enqueued_at: Mapped[float] = mapped_column(Float)
    # Results stored so far (done or failed), counted in each result's own transaction.
    stored: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    # The aggregator holding the round, and when it last renewed its claim.
    claim_owner: Mapped[str | None] = mapped_column(String(64), nullable=True)
    claimed_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    aggregated_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    aggregate_ms: Mapped[float | None] = mapped_column(Float, nullable=True)
    eval_ms: Mapped[float | None] = mapped_column(Float, nullable=True)
    accuracy: Mapped[float | None] = mapped_column(Float, nullable=True)
    loss: Mapped[float | None] = mapped_column(Float, nullable=True)
    train_loss: Mapped[float | None] = mapped_column(Float, nullable=True)
    # Updates the aggregator read while the round's last devices still trained (fedqueue.fl.read_ahead).
    read_ahead: Mapped[int | None] = mapped_column(Integer, nullable=True)
    # Simulated time when the round's version was made (fedqueue.fl.clock): the round's slowest
    # device bounds a synchronous round; a buffered-async version is made by its last arrival.
    sim_time: Mapped[float | None] = mapped_column(Float, nullable=True)


class TaskTimingRow(Base):
    """One task of any job kind, as the worker that ran it recorded it.

    The timeline, the report and `max_concurrency` read this table alone, so FL device
    tasks, aggregations and LLM batches share one picture. Results live in each kind's tables.
    """

    __tablename__ = "task_timings"
    # One row per task of a run: the delivery that stored the task's outcome.
    __table_args__ = (UniqueConstraint("run_id", "task", name="uq_task_timings_task"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), index=True)
    kind: Mapped[str] = mapped_column(String(16))  # the job kind: fl, llm
    task_type: Mapped[str] = mapped_column(String(32))  # what the task did: train, aggregate, generate
    task: Mapped[str] = mapped_column(String(200))  # its name within the run: "round 3 device 7"
    round_index: Mapped[int | None] = mapped_column(Integer, nullable=True)  # for kinds that run in rounds
    state: Mapped[str] = mapped_column(String(16))  # done | failed
    worker: Mapped[str] = mapped_column(String(200))
    pid: Mapped[int] = mapped_column(Integer)
    device_used: Mapped[str] = mapped_column(String(32))
    attempt: Mapped[int] = mapped_column(Integer)
    enqueued_at: Mapped[float] = mapped_column(Float)
    started_at: Mapped[float] = mapped_column(Float)
    finished_at: Mapped[float] = mapped_column(Float)
    load_ms: Mapped[float] = mapped_column(Float)
    compute_ms: Mapped[float] = mapped_column(Float)
    upload_ms: Mapped[float] = mapped_column(Float)
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    # FL packs: the pack the device was trained in ("pack 3-17"), shared by its devices' rows.
    pack: Mapped[str | None] = mapped_column(String(64), nullable=True)


class DeviceTaskRow(Base):
    """An FL device's result: its update, samples and loss. Its timing is a `TaskTimingRow`."""

    __tablename__ = "device_tasks"
    # One row per (run, round, device): a task delivered twice is stored once.
    __table_args__ = (UniqueConstraint("run_id", "round_index", "device", name="uq_device_tasks_key"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), index=True)
    round_index: Mapped[int] = mapped_column(Integer)
    device: Mapped[int] = mapped_column(Integer)
    state: Mapped[str] = mapped_column(String(16))  # done | failed
    worker: Mapped[str] = mapped_column(String(200))
    attempt: Mapped[int] = mapped_column(Integer)
    samples: Mapped[int] = mapped_column(Integer)
    loss: Mapped[float | None] = mapped_column(Float, nullable=True)
    update_key: Mapped[str | None] = mapped_column(String(300), nullable=True)
    update_sha256: Mapped[str | None] = mapped_column(String(64), nullable=True)
    update_nbytes: Mapped[int | None] = mapped_column(ByteSize, nullable=True)
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    # Buffered async: when the device left and arrived in simulated time, and what became of its
    # update (folded, stale, failed), with its staleness, weight and the version it went into.
    sim_dispatched: Mapped[float | None] = mapped_column(Float, nullable=True)
    sim_arrived: Mapped[float | None] = mapped_column(Float, nullable=True)
    fate: Mapped[str | None] = mapped_column(String(16), nullable=True)
    staleness: Mapped[int | None] = mapped_column(Integer, nullable=True)
    weight: Mapped[float | None] = mapped_column(Float, nullable=True)
    folded_into: Mapped[int | None] = mapped_column(Integer, nullable=True)


class ScheduleRow(Base):
    """A buffered-async run's place on its virtual clock, and the fold pass that holds it."""

    __tablename__ = "schedules"

    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True)
    state: Mapped[dict[str, Any]] = mapped_column(JSON)
    version: Mapped[int] = mapped_column(Integer)
    claim_owner: Mapped[str | None] = mapped_column(String(64), nullable=True)
    claimed_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    updated_at: Mapped[float] = mapped_column(Float)


class ModelVersionRow(Base):
    """A buffered-async run's versions that devices still train on or buffered updates came from.

    Kept in the store beside the published blobs, so a Redis that lost them has them put back.
    `server_state` is what the server itself carries from this version to the next (FedRevive's
    data-free synthesizer), when the strategy has any."""

    __tablename__ = "model_versions"

    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True)
    version: Mapped[int] = mapped_column(Integer, primary_key=True)
    sha256: Mapped[str] = mapped_column(String(64))
    data: Mapped[bytes] = mapped_column(LargeBinary)
    server_state: Mapped[bytes | None] = mapped_column(LargeBinary, nullable=True)


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


class CheckpointRow(Base):
    """The latest global model of a run, kept in the store so a run can resume anywhere."""

    __tablename__ = "checkpoints"

    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True)
    version: Mapped[int] = mapped_column(Integer)
    sha256: Mapped[str] = mapped_column(String(64))
    data: Mapped[bytes] = mapped_column(LargeBinary)


class UtilizationSample(Base):
    """One reading of a worker's device: GPU utilization and memory, or a CPU process's CPU% and RSS."""

    __tablename__ = "utilization_samples"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    worker: Mapped[str] = mapped_column(String(200))
    pid: Mapped[int] = mapped_column(Integer)
    device_used: Mapped[str] = mapped_column(String(32))
    sampled_at: Mapped[float] = mapped_column(Float, index=True)
    utilization: Mapped[float] = mapped_column(Float)  # percent: of one GPU, or of one CPU core
    memory_bytes: Mapped[int] = mapped_column(BigInteger)
