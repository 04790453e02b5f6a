"""LLM pipelines: items, their calls (one row per step) and the lanes that batch the calls.

Revision ID: llm_0002
Revises: llm_0001
"""

import sqlalchemy as sa
from alembic import op

revision = "llm_0002"
down_revision = "llm_0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "llm_pipeline_items",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("run_id", sa.String(32), sa.ForeignKey("runs.id", ondelete="CASCADE"), nullable=False),
        sa.Column("key", sa.String(300), nullable=False),
        sa.Column("input_id", sa.JSON(), nullable=True),
        sa.Column("line", sa.Integer(), nullable=False),
        sa.Column("item", sa.JSON(), nullable=True),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("steps", sa.Integer(), nullable=False),
        sa.Column("result", sa.JSON(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("finished_at", sa.Float(), nullable=True),
        sa.UniqueConstraint("run_id", "key", name="uq_llm_pipeline_items_key"),
    )
    op.create_index("ix_llm_pipeline_items_run_id", "llm_pipeline_items", ["run_id"])
    op.create_table(
        "llm_pipeline_calls",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("run_id", sa.String(32), sa.ForeignKey("runs.id", ondelete="CASCADE"), nullable=False),
        sa.Column("item_key", sa.String(300), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("request", sa.JSON(), nullable=False),
        sa.Column("length", sa.Integer(), nullable=False),
        sa.Column("settings", sa.String(200), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("lane", sa.Integer(), nullable=True),
        sa.Column("output", sa.Text(), nullable=True),
        sa.Column("prompt_tokens", sa.Integer(), nullable=True),
        sa.Column("generated_tokens", sa.Integer(), nullable=True),
        sa.Column("finish_reason", sa.String(16), nullable=True),
        sa.Column("worker", sa.String(200), nullable=True),
        sa.Column("finished_at", sa.Float(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.UniqueConstraint("run_id", "item_key", "step", name="uq_llm_pipeline_calls_step"),
    )
    op.create_index("ix_llm_pipeline_calls_run_id", "llm_pipeline_calls", ["run_id"])
    op.create_table(
        "llm_pipeline_lanes",
        sa.Column("run_id", sa.String(32), sa.ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("lane", sa.Integer(), primary_key=True, autoincrement=False),
        sa.Column("seq", sa.Integer(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("llm_pipeline_lanes")
    op.drop_table("llm_pipeline_calls")
    op.drop_table("llm_pipeline_items")
