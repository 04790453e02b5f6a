"""The pack a task timing belongs to: FL device tasks trained together in one delivery.

Revision ID: 0008
Revises: 0007
"""

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("task_timings") as batch:
        batch.add_column(sa.Column("pack", sa.String(64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("task_timings") as batch:
        batch.drop_column("pack")
