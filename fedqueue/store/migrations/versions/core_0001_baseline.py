"""The core's tables: runs, every kind's task timings, workers' utilization samples.

Revision ID: core_0001
Revises:

The job kinds' tables are created by their own branches. A database made by fedqueue's earlier, single line
of revisions (legacy/, up to 0011) already has these tables in this shape: it is brought to 0011 and recorded
at this revision without running it.
"""

import sqlalchemy as sa
from alembic import op

revision = "core_0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "runs",
        sa.Column("id", sa.String(32), primary_key=True),
        # Runs written before kinds existed were FL runs; the default stays so a database from then reads the same.
        sa.Column("kind", sa.String(16), nullable=False, server_default="fl"),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("config", sa.JSON(), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("rounds_total", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("finished_at", sa.Float(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("lease_owner", sa.String(100), nullable=True),
        sa.Column("lease_expires_at", sa.Float(), nullable=True),
        sa.Column("broker_id", sa.String(64), nullable=True),
    )
    op.create_table(
        "task_timings",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("run_id", sa.String(32), sa.ForeignKey("runs.id", ondelete="CASCADE"), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("task_type", sa.String(32), nullable=False),
        sa.Column("task", sa.String(200), nullable=False),
        sa.Column("round_index", sa.Integer(), nullable=True),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("worker", sa.String(200), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("device_used", sa.String(32), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("enqueued_at", sa.Float(), nullable=False),
        sa.Column("started_at", sa.Float(), nullable=False),
        sa.Column("finished_at", sa.Float(), nullable=False),
        sa.Column("load_ms", sa.Float(), nullable=False),
        sa.Column("compute_ms", sa.Float(), nullable=False),
        sa.Column("upload_ms", sa.Float(), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("pack", sa.String(64), nullable=True),
        sa.UniqueConstraint("run_id", "task", name="uq_task_timings_task"),
    )
    op.create_index("ix_task_timings_run_id", "task_timings", ["run_id"])
    op.create_table(
        "utilization_samples",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("worker", sa.String(200), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("device_used", sa.String(32), nullable=False),
        sa.Column("sampled_at", sa.Float(), nullable=False),
        sa.Column("utilization", sa.Float(), nullable=False),
        sa.Column("memory_bytes", sa.BigInteger(), nullable=False),
    )
    op.create_index("ix_utilization_samples_sampled_at", "utilization_samples", ["sampled_at"])


def downgrade() -> None:
    op.drop_table("utilization_samples")
    op.drop_table("task_timings")
    op.drop_table("runs")
