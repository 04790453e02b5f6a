"""The baseline for bench/overhead.py: a bare Celery app with one no-op task, configured as fedqueue's.

Workers load it as `celery -A raw_celery_app:app worker -P threads -c 1` with this folder on
PYTHONPATH; the broker comes from BENCH_BROKER_URL and the queue from BENCH_QUEUE.
"""

from __future__ import annotations

import os

from celery import Celery

QUEUE = os.environ.get("BENCH_QUEUE", "bench.raw")
NOOP = "bench.noop"

app = Celery("bench-raw", broker=os.environ.get("BENCH_BROKER_URL", "redis://127.0.0.1:6379/0"), set_as_current=False)
# The settings of fedqueue.queue.app that bear on per-task cost: JSON, no result backend, late acks,
# one message prefetched per slot, task events on.
app.conf.update(
    task_serializer="json",
    accept_content=["json"],
    result_backend=None,
    task_ignore_result=True,
    task_acks_late=True,
    task_reject_on_worker_lost=True,
    worker_prefetch_multiplier=1,
    task_default_queue=QUEUE,
    broker_transport_options={"visibility_timeout": 7260, "global_keyprefix": f"{QUEUE}:"},
    broker_connection_retry_on_startup=True,
    worker_send_task_events=True,
    task_send_sent_event=True,
    worker_hijack_root_logger=False,
)


@app.task(name=NOOP, acks_late=True, ignore_result=True)
def noop(message: dict) -> None:
    """Receives a message shaped like a device task and does nothing with it."""
