"""Buffered asynchronous FL: each run's schedule on its virtual clock, the versions it still needs, simulated
times and fates of updates.

Revision ID: 0010
Revises: 0009
"""

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def _device_columns() -> list[sa.Column]:
    """Made fresh for each use: a Column belongs to one table."""
    return [
        sa.Column("sim_dispatched", sa.Float(), nullable=True),
        sa.Column("sim_arrived", sa.Float(), nullable=True),
        sa.Column("fate", sa.String(16), nullable=True),
        sa.Column("staleness", sa.Integer(), nullable=True),
        sa.Column("weight", sa.Float(), nullable=True),
        sa.Column("folded_into", sa.Integer(), nullable=True),
    ]


def upgrade() -> None:
    op.create_table(
        "schedules",
        sa.Column("run_id", sa.String(32), sa.ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("state", sa.JSON(), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("claim_owner", sa.String(64), nullable=True),
        sa.Column("claimed_at", sa.Float(), nullable=True),
        sa.Column("updated_at", sa.Float(), nullable=False),
    )
    op.create_table(
        "model_versions",
        sa.Column("run_id", sa.String(32), sa.ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("version", sa.Integer(), primary_key=True),
        sa.Column("sha256", sa.String(64), nullable=False),
        sa.Column("data", sa.LargeBinary(), nullable=False),
    )
    with op.batch_alter_table("rounds") as batch:
        batch.add_column(sa.Column("sim_time", sa.Float(), nullable=True))
    with op.batch_alter_table("device_tasks") as batch:
        for column in _device_columns():
            batch.add_column(column)


def downgrade() -> None:
    with op.batch_alter_table("device_tasks") as batch:
        for column in _device_columns():
            batch.drop_column(column.name)
    with op.batch_alter_table("rounds") as batch:
        batch.drop_column("sim_time")
    op.drop_table("model_versions")
    op.drop_table("schedules")
