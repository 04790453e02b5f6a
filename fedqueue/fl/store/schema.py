"""The FL job kind's tables: rounds, device results, checkpoints, and a buffered-async run's schedule and kept
versions. They share the core's declarative base (runs are the core's); the FL migration branch changes them."""

from __future__ import annotations

from typing import Any

from sqlalchemy import JSON, Float, ForeignKey, Integer, LargeBinary, String, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from fedqueue.store.schema import Base, ByteSize


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
    # Updates the aggregator read while the round's last devices still trained (fedqueue.fl.strategy.sync.read_ahead).
    read_ahead: Mapped[int | None] = mapped_column(Integer, nullable=True)
    # Simulated time when the round's version was made (fedqueue.fl.clock.trips): the round's slowest
    # device bounds a synchronous round; a buffered-async version is made by its last arrival.
    sim_time: Mapped[float | None] = mapped_column(Float, nullable=True)
    # Per-class test accuracy and loss of an evaluated version: {"accuracy": [...], "loss": [...]}, one per class.
    label_wise: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)


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


class CheckpointRow(Base):
    """The latest global model of a run, kept in the store so a run can resume anywhere."""

    __tablename__ = "checkpoints"

    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True)
    version: Mapped[int] = mapped_column(Integer)
    sha256: Mapped[str] = mapped_column(String(64))
    data: Mapped[bytes] = mapped_column(LargeBinary)


class StopRow(Base):
    """Why a finished run ended: the rule (fedqueue.fl.clock.stops), its one line, and the version it ended on."""

    __tablename__ = "run_stops"

    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True)
    rule: Mapped[str] = mapped_column(String(32))
    reason: Mapped[str] = mapped_column(Text)
    version: Mapped[int] = mapped_column(Integer)
    sim_time: Mapped[float | None] = mapped_column(Float, nullable=True)
