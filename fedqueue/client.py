"""Submitting runs: validate, connect (failing fast), record, publish, enqueue."""

from __future__ import annotations

from fedqueue.config import Settings
from fedqueue.runconfig import RunConfig
from fedqueue.scheduler import submit_run
from fedqueue.services import Services, open_services


def open_client(settings: Settings) -> Services:
    """Services for a submitting process: the store migrated, tasks published through Celery."""
    from fedqueue.queue.app import make_app
    from fedqueue.queue.publish import enqueue_with

    settings.activate_plugin_path()
    app = make_app(settings)
    return open_services(settings, enqueue_with(app, settings), migrate=True)


def submit(settings: Settings, config: RunConfig) -> str:
    """Enqueue a run's first round and return its id; the workers carry it on from there."""
    services = open_client(settings)
    try:
        return submit_run(services, config)
    finally:
        services.close()
