"""The SQL store (SQLAlchemy 2): runs, task timings, leases, utilization samples; each job kind keeps its own
tables, their queries and their schema branch in its package. `fedqueue.core.database.open_store` opens it with
every installed kind's tables."""

from fedqueue.store.db import connect_store
from fedqueue.store.repo import Store

__all__ = ["Store", "connect_store"]
