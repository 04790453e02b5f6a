"""Blobs spilled from a broker near its memory limit (`maxmemory`): a table of their bytes, keyed by blob name.

Revision ID: core_0002
Revises: core_0001
"""

import sqlalchemy as sa
from alembic import op

revision = "core_0002"
down_revision = "core_0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "spilled_blobs",
        sa.Column("key", sa.String(400), primary_key=True),
        sa.Column("data", sa.LargeBinary(), nullable=False),
        sa.Column("expires_at", sa.Float(), nullable=False),
    )
    op.create_index("ix_spilled_blobs_expires_at", "spilled_blobs", ["expires_at"])


def downgrade() -> None:
    op.drop_table("spilled_blobs")
