"""The SQL store (SQLAlchemy 2): runs, rounds, device tasks, checkpoints."""

from fedqueue.store.db import open_store
from fedqueue.store.repo import Store

__all__ = ["Store", "open_store"]
