"""The LLM kind's table: one row per prompt of a batch job, and its output once generated.

Revision ID: llm_0001
Revises:

A database made by fedqueue's earlier single line of revisions (up to 0011) already holds the table in this
shape: it is created only where it is missing, and the revision is recorded either way.
"""

import sqlalchemy as sa
from alembic import op

revision = "llm_0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    if sa.inspect(op.get_bind()).has_table("llm_prompts"):
        return
    op.create_table(
        "llm_prompts",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("run_id", sa.String(32), sa.ForeignKey("runs.id", ondelete="CASCADE"), nullable=False),
        sa.Column("key", sa.String(300), nullable=False),
        sa.Column("input_id", sa.JSON(), nullable=True),
        sa.Column("line", sa.Integer(), nullable=False),
        sa.Column("prompt_sha256", sa.String(64), nullable=False),
        sa.Column("prompt", sa.Text(), nullable=True),
        sa.Column("messages", sa.JSON(), nullable=True),
        sa.Column("same_as", sa.String(300), nullable=True),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("batch", sa.Integer(), nullable=True),
        sa.Column("output", sa.Text(), nullable=True),
        sa.Column("prompt_tokens", sa.Integer(), nullable=True),
        sa.Column("generated_tokens", sa.Integer(), nullable=True),
        sa.Column("finish_reason", sa.String(16), nullable=True),
        sa.Column("worker", sa.String(200), nullable=True),
        sa.Column("latency_ms", sa.Float(), nullable=True),
        sa.Column("finished_at", sa.Float(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.UniqueConstraint("run_id", "key", name="uq_llm_prompts_key"),
    )
    op.create_index("ix_llm_prompts_run_id", "llm_prompts", ["run_id"])


def downgrade() -> None:
    op.drop_table("llm_prompts")
