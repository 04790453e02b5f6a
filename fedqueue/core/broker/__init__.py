"""What fedqueue keeps in the broker's Redis besides Celery's messages: its keys, the task ledger and the
heartbeats that keep its running marks alive, blobs (spilled to the store when Redis is full), dead
letters, how full the broker is, which worker processes read which queue; and in-memory twins of the
ledger and the blob store for tests with no Redis.
"""
