"""Why a finished FL run ended (its stop rule), one row per run.

Revision ID: fl_0002
Revises: fl_0001
"""

import sqlalchemy as sa
from alembic import op

revision = "fl_0002"
down_revision = "fl_0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "run_stops",
        sa.Column(
            "run_id", sa.String(32), sa.ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True, nullable=False
        ),
        sa.Column("rule", sa.String(32), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("sim_time", sa.Float(), nullable=True),
    )


def downgrade() -> None:
    op.drop_table("run_stops")
