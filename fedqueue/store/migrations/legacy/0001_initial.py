"""Initial schema: runs, rounds, device tasks, checkpoints.

Revision ID: 0001
Revises:
"""

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "runs",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("config", sa.JSON(), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("rounds_total", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("finished_at", sa.Float(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
    )
    op.create_table(
        "rounds",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("run_id", sa.String(32), sa.ForeignKey("runs.id", ondelete="CASCADE"), nullable=False),
        sa.Column("round_index", sa.Integer(), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("selected", sa.JSON(), nullable=False),
        sa.Column("model_key", sa.String(300), nullable=False),
        sa.Column("model_sha256", sa.String(64), nullable=False),
        sa.Column("model_nbytes", sa.Integer(), nullable=False),
        sa.Column("enqueued_at", sa.Float(), nullable=False),
        sa.Column("aggregated_at", sa.Float(), nullable=True),
        sa.Column("aggregate_ms", sa.Float(), nullable=True),
        sa.Column("eval_ms", sa.Float(), nullable=True),
        sa.Column("accuracy", sa.Float(), nullable=True),
        sa.Column("loss", sa.Float(), nullable=True),
        sa.Column("train_loss", sa.Float(), nullable=True),
        sa.UniqueConstraint("run_id", "round_index", name="uq_rounds_run_round"),
    )
    op.create_index("ix_rounds_run_id", "rounds", ["run_id"])
    op.create_table(
        "device_tasks",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("run_id", sa.String(32), sa.ForeignKey("runs.id", ondelete="CASCADE"), nullable=False),
        sa.Column("round_index", sa.Integer(), nullable=False),
        sa.Column("device", sa.Integer(), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("worker", sa.String(200), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("device_used", sa.String(32), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("enqueued_at", sa.Float(), nullable=False),
        sa.Column("started_at", sa.Float(), nullable=False),
        sa.Column("finished_at", sa.Float(), nullable=False),
        sa.Column("load_ms", sa.Float(), nullable=False),
        sa.Column("train_ms", sa.Float(), nullable=False),
        sa.Column("upload_ms", sa.Float(), nullable=False),
        sa.Column("samples", sa.Integer(), nullable=False),
        sa.Column("loss", sa.Float(), nullable=True),
        sa.Column("update_key", sa.String(300), nullable=True),
        sa.Column("update_sha256", sa.String(64), nullable=True),
        sa.Column("update_nbytes", sa.Integer(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.UniqueConstraint("run_id", "round_index", "device", name="uq_device_tasks_key"),
    )
    op.create_index("ix_device_tasks_run_id", "device_tasks", ["run_id"])
    op.create_table(
        "checkpoints",
        sa.Column("run_id", sa.String(32), sa.ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("sha256", sa.String(64), nullable=False),
        sa.Column("data", sa.LargeBinary(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("checkpoints")
    op.drop_table("device_tasks")
    op.drop_table("rounds")
    op.drop_table("runs")
