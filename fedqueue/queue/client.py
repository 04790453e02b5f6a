"""Services for a process that submits or schedules: the store migrated, tasks published through Celery."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fedqueue.config import Settings
from fedqueue.core.services import Services, WorkerSlots, open_services

if TYPE_CHECKING:
    from celery import Celery

# How long a submit waits for a first worker to answer when it sizes packs for them, and then for
# each next answer: workers answer within milliseconds of each other, so it need not wait a second.
FIRST_REPLY_TIMEOUT_S = 1.0
REPLY_GAP_S = 0.15


def open_client(settings: Settings, worker_slots: WorkerSlots | None = None) -> Services:
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
        if not app.control.ping(timeout=FIRST_REPLY_TIMEOUT_S, limit=1):
            return {}
        # The timeout is the wait for each next answer: this returns REPLY_GAP_S after the last one.
        stats = app.control.inspect(timeout=REPLY_GAP_S).stats() or {}
        return {name: int(info.get("pool", {}).get("max-concurrency", 1)) for name, info in stats.items()}

    return worker_slots
