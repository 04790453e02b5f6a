"""Per-class test accuracy and loss of an evaluated version (FedRevive's `label_wise` metrics).

Revision ID: fl_0003
Revises: fl_0002
"""

import sqlalchemy as sa
from alembic import op

revision = "fl_0003"
down_revision = "fl_0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("rounds") as batch:
        batch.add_column(sa.Column("label_wise", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("rounds") as batch:
        batch.drop_column("label_wise")
