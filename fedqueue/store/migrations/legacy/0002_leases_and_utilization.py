"""Scheduler leases on runs; per-worker device utilization samples.

Revision ID: 0002
Revises: 0001
"""

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("lease_owner", sa.String(100), nullable=True))
        batch.add_column(sa.Column("lease_expires_at", sa.Float(), nullable=True))
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
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("lease_expires_at")
        batch.drop_column("lease_owner")
