"""The FL kind's tables: rounds, device results, checkpoints, a buffered-async run's schedule and kept versions.

Revision ID: fl_0001
Revises:

A database made by fedqueue's earlier single line of revisions (up to 0011) already holds these tables in
this shape: each is created only where it is missing, and the revision is recorded either way.
"""

import sqlalchemy as sa
from alembic import op

revision = "fl_0001"
down_revision = None
branch_labels = None
depends_on = None

# Byte sizes reach past 2 GiB: 64 bits on Postgres; SQLite's INTEGER already holds 64 bits.
BYTE_SIZE = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def _missing(table: str) -> bool:
    return not sa.inspect(op.get_bind()).has_table(table)


def _run_id(primary_key: bool = False) -> sa.Column:
    return sa.Column(
        "run_id", sa.String(32), sa.ForeignKey("runs.id", ondelete="CASCADE"), primary_key=primary_key, nullable=False
    )


def _rounds() -> None:
    op.create_table(
        "rounds",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        _run_id(),
        sa.Column("round_index", sa.Integer(), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("selected", sa.JSON(), nullable=False),
        sa.Column("model_key", sa.String(300), nullable=False),
        sa.Column("model_sha256", sa.String(64), nullable=False),
        sa.Column("model_nbytes", BYTE_SIZE, nullable=False),
        sa.Column("enqueued_at", sa.Float(), nullable=False),
        sa.Column("stored", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("claim_owner", sa.String(64), nullable=True),
        sa.Column("claimed_at", sa.Float(), nullable=True),
        sa.Column("aggregated_at", sa.Float(), nullable=True),
        sa.Column("aggregate_ms", sa.Float(), nullable=True),
        sa.Column("eval_ms", sa.Float(), nullable=True),
        sa.Column("accuracy", sa.Float(), nullable=True),
        sa.Column("loss", sa.Float(), nullable=True),
        sa.Column("train_loss", sa.Float(), nullable=True),
        sa.Column("read_ahead", sa.Integer(), nullable=True),
        sa.Column("sim_time", sa.Float(), nullable=True),
        sa.UniqueConstraint("run_id", "round_index", name="uq_rounds_run_round"),
    )
    op.create_index("ix_rounds_run_id", "rounds", ["run_id"])


def _device_tasks() -> None:
    op.create_table(
        "device_tasks",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        _run_id(),
        sa.Column("round_index", sa.Integer(), nullable=False),
        sa.Column("device", sa.Integer(), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("worker", sa.String(200), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("samples", sa.Integer(), nullable=False),
        sa.Column("loss", sa.Float(), nullable=True),
        sa.Column("update_key", sa.String(300), nullable=True),
        sa.Column("update_sha256", sa.String(64), nullable=True),
        sa.Column("update_nbytes", BYTE_SIZE, nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("sim_dispatched", sa.Float(), nullable=True),
        sa.Column("sim_arrived", sa.Float(), nullable=True),
        sa.Column("fate", sa.String(16), nullable=True),
        sa.Column("staleness", sa.Integer(), nullable=True),
        sa.Column("weight", sa.Float(), nullable=True),
        sa.Column("folded_into", sa.Integer(), nullable=True),
        sa.UniqueConstraint("run_id", "round_index", "device", name="uq_device_tasks_key"),
    )
    op.create_index("ix_device_tasks_run_id", "device_tasks", ["run_id"])


def _schedules() -> None:
    op.create_table(
        "schedules",
        _run_id(primary_key=True),
        sa.Column("state", sa.JSON(), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("claim_owner", sa.String(64), nullable=True),
        sa.Column("claimed_at", sa.Float(), nullable=True),
        sa.Column("updated_at", sa.Float(), nullable=False),
    )


def _model_versions() -> None:
    op.create_table(
        "model_versions",
        _run_id(primary_key=True),
        sa.Column("version", sa.Integer(), primary_key=True),
        sa.Column("sha256", sa.String(64), nullable=False),
        sa.Column("data", sa.LargeBinary(), nullable=False),
        sa.Column("server_state", sa.LargeBinary(), nullable=True),
    )


def _checkpoints() -> None:
    op.create_table(
        "checkpoints",
        _run_id(primary_key=True),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("sha256", sa.String(64), nullable=False),
        sa.Column("data", sa.LargeBinary(), nullable=False),
    )


TABLES = {
    "rounds": _rounds,
    "device_tasks": _device_tasks,
    "schedules": _schedules,
    "model_versions": _model_versions,
    "checkpoints": _checkpoints,
}


def upgrade() -> None:
    for table, create in TABLES.items():
        if _missing(table):
            create()


def downgrade() -> None:
    for table in reversed(TABLES):
        op.drop_table(table)
