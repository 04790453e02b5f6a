"""The core's tables: runs, task timings of every kind, utilization samples, blobs spilled from a full broker.
Times are UNIX seconds (float): workers on several hosts compare them directly. Job kinds declare their own
tables on the same `Base`."""

from __future__ import annotations

from typing import Any

from sqlalchemy import JSON, BigInteger, Float, ForeignKey, Integer, LargeBinary, String, Text, UniqueConstraint
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

NAME_MAX = 200  # longest run name; the run config refuses longer ones
BLOB_KEY_MAX = 400  # longest blob name a spilled blob may have (FL's are under 100 characters)
# Byte sizes reach past 2 GiB: 64 bits on Postgres; SQLite's INTEGER already holds 64 bits.
ByteSize = BigInteger().with_variant(Integer(), "sqlite")


class Base(DeclarativeBase):
    pass


class RunRow(Base):
    __tablename__ = "runs"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    # The job kind that owns the run: the supervisor repairs it with that kind's pass. Every run names its kind;
    # the database's default fills only rows written before kinds existed, all of them FL runs.
    kind: Mapped[str] = mapped_column(String(16), server_default="fl")
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


class SpilledBlobRow(Base):
    """A blob that did not fit under the broker's memory limit: kept here instead of in Redis, until it expires.

    Any kind's blob (keyed by its blob name, as in Redis); expired rows read as missing and are purged now and then.
    """

    __tablename__ = "spilled_blobs"

    key: Mapped[str] = mapped_column(String(BLOB_KEY_MAX), primary_key=True)
    data: Mapped[bytes] = mapped_column(LargeBinary)
    expires_at: Mapped[float] = mapped_column(Float, index=True)
