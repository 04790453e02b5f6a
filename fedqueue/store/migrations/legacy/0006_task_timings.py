"""One task-timing table for every job kind; FL device results keep only what is theirs.

Revision ID: 0006
Revises: 0005

The timings of stored device tasks move to `task_timings` (task type "train"). Columns are dropped
and added with plain ALTER TABLE, never a batch rebuild (see 0005: a rebuild cascades deletes).
"""

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

# Moved columns: device_tasks' name, task_timings' name, the downgrade's default.
MOVED = (
    ("pid", "pid", "0"),
    ("device_used", "device_used", "''"),
    ("enqueued_at", "enqueued_at", "0"),
    ("started_at", "started_at", "0"),
    ("finished_at", "finished_at", "0"),
    ("load_ms", "load_ms", "0"),
    ("train_ms", "compute_ms", "0"),
    ("upload_ms", "upload_ms", "0"),
)
MOVED_TYPES = {
    "pid": sa.Integer(),
    "device_used": sa.String(32),
}


def upgrade() -> None:
    op.create_table(
        "task_timings",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("run_id", sa.String(32), sa.ForeignKey("runs.id", ondelete="CASCADE"), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("task_type", sa.String(32), nullable=False),
        sa.Column("task", sa.String(200), nullable=False),
        sa.Column("round_index", sa.Integer(), nullable=True),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("worker", sa.String(200), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("device_used", sa.String(32), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("enqueued_at", sa.Float(), nullable=False),
        sa.Column("started_at", sa.Float(), nullable=False),
        sa.Column("finished_at", sa.Float(), nullable=False),
        sa.Column("load_ms", sa.Float(), nullable=False),
        sa.Column("compute_ms", sa.Float(), nullable=False),
        sa.Column("upload_ms", sa.Float(), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.UniqueConstraint("run_id", "task", name="uq_task_timings_task"),
    )
    op.create_index("ix_task_timings_run_id", "task_timings", ["run_id"])
    moved_from = ", ".join(old for old, _, _ in MOVED)
    moved_to = ", ".join(new for _, new, _ in MOVED)
    op.execute(
        "INSERT INTO task_timings (run_id, kind, task_type, task, round_index, state, worker, attempt, error, "
        f"{moved_to}) SELECT run_id, 'fl', 'train', "
        "'round ' || CAST(round_index AS VARCHAR) || ' device ' || CAST(device AS VARCHAR), "
        f"round_index, state, worker, attempt, error, {moved_from} FROM device_tasks"
    )
    for old, _, _ in MOVED:
        op.drop_column("device_tasks", old)


def downgrade() -> None:
    # The train timing that belongs to each device row.
    same_task = (
        "t.run_id = device_tasks.run_id AND t.task_type = 'train' AND t.task = 'round ' "
        "|| CAST(device_tasks.round_index AS VARCHAR) || ' device ' || CAST(device_tasks.device AS VARCHAR)"
    )
    for old, new, default in MOVED:
        column_type = MOVED_TYPES.get(old, sa.Float())
        op.add_column("device_tasks", sa.Column(old, column_type, nullable=False, server_default=sa.text(default)))
        op.execute(
            f"UPDATE device_tasks SET {old} = (SELECT t.{new} FROM task_timings t WHERE {same_task})"
            f" WHERE EXISTS (SELECT 1 FROM task_timings t WHERE {same_task})"
        )
    op.drop_index("ix_task_timings_run_id", "task_timings")
    op.drop_table("task_timings")
