"""Celery tasks: decode the message, hand it to the device-task code, nothing else."""

from __future__ import annotations

import logging
import threading
import traceback
from typing import Any

from celery import Celery, Task
from celery.exceptions import Reject

from fedqueue.config import Settings
from fedqueue.device_task import WorkerCache, record_failure, run_device_task
from fedqueue.messages import DeviceTask, MessageError
from fedqueue.queue.app import TRAIN_DEVICE
from fedqueue.queue.publish import enqueue_with
from fedqueue.services import Services, open_services

log = logging.getLogger(__name__)


class WorkerState:
    """Connections and caches of one worker process, opened at its first task (never at start-up)."""

    def __init__(self, app: Celery, settings: Settings) -> None:
        self._app = app
        self._settings = settings
        self._lock = threading.Lock()
        self._services: Services | None = None
        self.cache = WorkerCache()

    def services(self) -> Services:
        with self._lock:
            if self._services is None:
                from fedqueue.fl.devices import configure_determinism

                configure_determinism(self._settings.threads_per_task)
                self._services = open_services(
                    self._settings, enqueue_with(self._app, self._settings), migrate=False
                )
            return self._services


def register_tasks(app: Celery, settings: Settings) -> WorkerState:
    state = WorkerState(app, settings)

    @app.task(name=TRAIN_DEVICE, bind=True, acks_late=True, ignore_result=True)
    def train_device(self: Task, message: Any) -> None:
        try:
            task = DeviceTask.from_dict(message)
        except MessageError as err:
            log.error("rejected malformed task message: %s", err)
            raise Reject(str(err), requeue=False) from None
        services = state.services()
        worker = self.request.hostname or "unknown"
        attempt = services.start_attempt(task.run_id, task.round_index, task.device, worker)
        try:
            with services.heartbeat(task.run_id, task.round_index, task.device, worker):
                # A task that keeps killing its worker comes back with no exception to count: cap it here.
                if attempt > settings.max_attempts:
                    seen = attempt - 1
                    record_failure(services, task, worker, seen, f"gave up after {seen} attempts (worker lost)")
                    return
                run_device_task(services, state.cache, task, worker, attempt)
        except Exception as err:
            if attempt < settings.max_attempts:
                log.warning("device task failed (attempt %d), retrying: %s", attempt, err)
                services.hold(task.run_id, task.round_index, task.device, worker)
                raise self.retry(exc=err, countdown=1, max_retries=None) from None
            record_failure(services, task, worker, attempt, traceback.format_exc())

    return state
