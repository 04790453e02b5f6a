"""A count of each round's stored results, kept in the same transaction as each result row.

Revision ID: 0004
Revises: 0003
"""

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("rounds") as batch:
        batch.add_column(sa.Column("stored", sa.Integer(), nullable=False, server_default="0"))
    op.execute(
        "UPDATE rounds SET stored = (SELECT COUNT(*) FROM device_tasks"
        " WHERE device_tasks.run_id = rounds.run_id AND device_tasks.round_index = rounds.round_index)"
    )


def downgrade() -> None:
    with op.batch_alter_table("rounds") as batch:
        batch.drop_column("stored")
