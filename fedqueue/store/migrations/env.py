"""Alembic environment: runs against the connection fedqueue hands over."""

from alembic import context

from fedqueue.store.schema import Base

connection = context.config.attributes["connection"]
context.configure(connection=connection, target_metadata=Base.metadata, render_as_batch=True)
with context.begin_transaction():
    context.run_migrations()
