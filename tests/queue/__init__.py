"""Tests of fedqueue.queue: Celery workers on real Redis, publishing, the transport, forged and hostile
messages, reliability under killed workers, the worker plan, Flower, a second worker host.
"""
