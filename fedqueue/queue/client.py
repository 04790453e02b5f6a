"""Services for a process that submits or schedules: the store migrated, tasks published through Celery."""

from __future__ import annotations

from fedqueue.config import Settings
from fedqueue.core.services import Services, open_services


def open_client(settings: Settings) -> Services:
    from fedqueue.queue.app import make_app
    from fedqueue.queue.publish import enqueue_with

    settings.activate_plugin_path()
    app = make_app(settings)
    return open_services(settings, enqueue_with(app, settings), migrate=True)
