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
# How long a question waits for a worker to take it: on a broker whose workers may not be there (a deployment's,
# where a submit may come before its workers), and on a running `fedqueue up` cluster's, whose workers may be busy.
ASK_UNSURE_S = 2.0
ASK_STANDING_S = 10.0


def open_client_services(
    settings: Settings, worker_slots: WorkerSlots | None = None, ask_within_s: float = ASK_UNSURE_S
) -> Services:
    """`worker_slots`: the workers' slots where the caller knows them (it started them), else asked of the workers.
    `ask_within_s`: how long a question to the workers (fedqueue.queue.ask) waits for one to take it; 0: none asked."""
    from fedqueue.queue.app import make_app
    from fedqueue.queue.ask import ask_with
    from fedqueue.queue.publish import enqueue_with

    settings.activate_plugin_path()
    app = make_app(settings)
    slots = worker_slots if worker_slots is not None else worker_slots_of(app)
    services = open_services(settings, enqueue_with(app, settings), migrate=True, worker_slots=slots)
    services.ask_workers = ask_with(app, settings, ask_within_s, services.blobs)
    return services


def worker_slots_of(app: Celery) -> WorkerSlots:
    """Ask the workers on the broker for their pool sizes (only when a submit needs them)."""

    def worker_slots() -> dict[str, int]:
        # On a connection of its own: a request the broker refuses (full, gone) must not leave the publishers'
        # pooled connection with a closed channel, which kombu would hand out again.
        with app.connection_for_write() as connection:
            stats = app.control.inspect(timeout=STATS_TIMEOUT_S, connection=connection).stats() or {}
        return {name: int(info.get("pool", {}).get("max-concurrency", 1)) for name, info in stats.items()}

    return worker_slots
