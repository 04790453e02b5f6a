"""The toy kind's table: one square per number of a run.

Revision ID: toy_0001
Revises:
"""

import sqlalchemy as sa
from alembic import op

revision = "toy_0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "toy_squares",
        sa.Column("run_id", sa.String(32), sa.ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("number", sa.Integer(), primary_key=True),
        sa.Column("square", sa.Integer(), nullable=False),
        sa.Column("worker", sa.String(200), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("toy_squares")
