"""Four learning rates side by side on the same workers, from Python.

    .venv/bin/python examples/sweep.py

With FEDQUEUE_BROKER_URL set, the runs go to the workers on that broker;
otherwise an embedded Redis and local workers run them and stop at the end.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

from rich.console import Console
from rich.table import Table

import fedqueue

CONFIG = Path(__file__).with_name("digits_fedavg.toml")
LEARNING_RATES = (0.02, 0.05, 0.1, 0.2)


def main() -> None:
    settings = fedqueue.Settings.from_env()
    with contextlib.ExitStack() as stack:
        if not settings.broker_url:
            settings = stack.enter_context(fedqueue.local_cluster()).settings
        # All four are queued before any finishes: their device tasks interleave on the workers.
        handles = {
            lr: fedqueue.submit(CONFIG, settings=settings, local_lr=lr, name=f"sweep-lr{lr}") for lr in LEARNING_RATES
        }
        results = {lr: handle.wait() for lr, handle in handles.items()}

    table = Table(title="learning-rate sweep (FedAvg, digits, 10 rounds)")
    for column in ("local_lr", "run", "final accuracy", "wall s", "tasks"):
        table.add_column(column, justify="right")
    for lr, status in results.items():
        table.add_row(
            f"{lr}",
            status["id"],
            f"{status['final_accuracy']:.4f}",
            f"{status['wall_s']:.2f}",
            str(status["tasks_done"]),
        )
    Console().print(table)


if __name__ == "__main__":
    main()
