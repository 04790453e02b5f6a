"""The SQL store (SQLAlchemy 2): runs, task timings, leases, utilization samples; each job kind keeps its own
tables and their queries in its package."""

from fedqueue.store.db import open_store
from fedqueue.store.repo import Store

__all__ = ["Store", "open_store"]
