"""LLM batch jobs: one row per prompt, with its output.

Revision ID: 0007
Revises: 0006
"""

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
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
    op.drop_index("ix_llm_prompts_run_id", "llm_prompts")
    op.drop_table("llm_prompts")
