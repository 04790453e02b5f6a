"""Federated learning with torch only: data, models, local training, aggregation.

Nothing here imports Celery, the store or the broker, so it tests without a worker.
"""
