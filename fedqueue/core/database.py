"""The store as every process opens it: the core's tables and those of each installed job kind."""

from __future__ import annotations

from fedqueue.core.jobs import schema_branches
from fedqueue.store import Store, connect_store


def open_store(url: str, *, migrate: bool = False) -> Store:
    """Connect to the store; with `migrate`, bring the core's and every installed kind's tables to their newest
    revisions, and without, change nothing and refuse (in one line) a schema this code cannot use."""
    return connect_store(url, schema_branches(), migrate=migrate)
