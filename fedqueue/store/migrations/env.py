"""Alembic environment for every schema branch: runs against the connection fedqueue hands over, recording the
branch's revision in the branch's own version table."""

from alembic import context

attributes = context.config.attributes
context.configure(
    connection=attributes["connection"],
    version_table=attributes.get("version_table", "alembic_version"),
    render_as_batch=True,
)
with context.begin_transaction():
    context.run_migrations()
