"""Services for a process that submits or schedules: the store migrated, tasks published through Celery."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fedqueue.config import Settings
from fedqueue.core.connect import open_services
from fedqueue.core.services import Services, WorkerSlots

if TYPE_CHECKING:
    from celery import Celery

# How long a submit waits for the workers' answers when it sizes packs for them. Not shorter: a worker
# busy importing torch in its warm-up can answer a few hundred milliseconds after the others, and a
# worker missed makes packs too large for the slots there are.
STATS_TIMEOUT_S = 1.0


def open_client_services(settings: Settings, worker_slots: WorkerSlots | None = None) -> Services:
    """`worker_slots`: the workers' slots where the caller knows them (it started them), else asked of the workers."""
    from fedqueue.queue.app import make_app
    from fedqueue.queue.publish import enqueue_with

    settings.activate_plugin_path()
    app = make_app(settings)
    slots = worker_slots if worker_slots is not None else worker_slots_of(app)
    return open_services(settings, enqueue_with(app, settings), migrate=True, worker_slots=slots)


def worker_slots_of(app: Celery) -> WorkerSlots:
    """Ask the workers on the broker for their pool sizes (only when a submit needs them)."""

    def worker_slots() -> dict[str, int]:
        # On a connection of its own: a request the broker refuses (full, gone) must not leave the publishers'
        # pooled connection with a closed channel, which kombu would hand out again.
        with app.connection_for_write() as connection:
            stats = app.control.inspect(timeout=STATS_TIMEOUT_S, connection=connection).stats() or {}
        return {name: int(info.get("pool", {}).get("max-concurrency", 1)) for name, info in stats.items()}

    return worker_slots
