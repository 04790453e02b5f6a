"""Job kinds and broker ids on runs; the owner of a round's claim; 64-bit byte sizes.

Revision ID: 0005
Revises: 0004

Columns are added with plain ALTER TABLE, never a batch rebuild: rebuilding `runs` on SQLite drops it,
and with foreign keys on, that drop deletes every round and device task of every run.
"""

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

BYTE_SIZES = (("rounds", "model_nbytes", False), ("device_tasks", "update_nbytes", True))


def _retype_byte_sizes(new: sa.types.TypeEngine, old: sa.types.TypeEngine) -> None:
    # SQLite's INTEGER already holds 64 bits; changing its declared type there would need a table rebuild.
    if op.get_bind().dialect.name != "postgresql":
        return
    for table, column, nullable in BYTE_SIZES:
        op.alter_column(table, column, type_=new, existing_type=old, existing_nullable=nullable)


def upgrade() -> None:
    op.add_column("runs", sa.Column("kind", sa.String(16), nullable=False, server_default="fl"))
    op.add_column("runs", sa.Column("broker_id", sa.String(64), nullable=True))
    op.add_column("rounds", sa.Column("claim_owner", sa.String(64), nullable=True))
    _retype_byte_sizes(sa.BigInteger(), sa.Integer())


def downgrade() -> None:
    _retype_byte_sizes(sa.Integer(), sa.BigInteger())
    op.drop_column("rounds", "claim_owner")
    op.drop_column("runs", "broker_id")
    op.drop_column("runs", "kind")
