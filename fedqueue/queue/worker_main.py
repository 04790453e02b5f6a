"""`python -m fedqueue.queue.worker_main ARGS` is `celery ARGS`, leaving without Python's teardown.

A worker process has torch loaded: its teardown would add over a second to every stop.
"""

from celery.__main__ import main

from fedqueue.core.process.fast_exit import run_then_exit

if __name__ == "__main__":
    run_then_exit(main)
