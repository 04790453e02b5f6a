"""The app a `celery worker` process loads (`-A fedqueue.queue.worker_app`); settings come from the environment."""

import logging
import os
import threading
import time
from typing import Any

from celery.signals import worker_init, worker_ready, worker_shutdown

from fedqueue.config import Settings
from fedqueue.core import jobs
from fedqueue.core.utilization import Sampler
from fedqueue.queue.app import make_app
from fedqueue.queue.readiness import READY_KEY_ENV, announce_ready
from fedqueue.queue.tasks import register_tasks

log = logging.getLogger(__name__)

settings = Settings.from_env()
settings.activate_plugin_path()
app = make_app(settings)
state = register_tasks(app, settings)
_sampler: Sampler | None = None
_warmed = threading.Event()


@worker_init.connect
def _start_warm_up(**_: Any) -> None:
    # Beside consuming, not before it: tasks already queued start at once, and the warm-up's
    # imports overlap the worker's own start-up instead of adding to it. Marked running before any task
    # is taken, so a task that must not import beside it (jobs.wait_for_warm_up) sees it.
    jobs.warm_up_started()
    threading.Thread(target=_warm_up, name="fedqueue-warm-up", daemon=True).start()


def _warm_up() -> None:
    began = time.monotonic()
    try:
        for kind in jobs.select(settings.jobs):
            if kind.warm_up is not None:
                kind.warm_up(settings)
        log.info("warm-up done in %.2f s", time.monotonic() - began)
    except Exception:  # a task meets the same failure and reports it where the run shows it
        log.exception("warm-up failed")
    finally:
        jobs.warm_up_ended()
        _warmed.set()


@worker_ready.connect
def _start_sampler(sender: Any = None, **_: Any) -> None:
    # Started here, not at import: only a consuming worker samples, under the hostname its tasks record.
    global _sampler
    hostname = getattr(sender, "hostname", None) or "unknown"
    _sampler = Sampler(settings.database_url, hostname).start()
    ready_key = os.environ.get(READY_KEY_ENV)  # set by fedqueue's launcher, not a user setting
    if ready_key:
        threading.Thread(target=_say_ready, args=(ready_key, hostname), name="fedqueue-ready", daemon=True).start()


def _say_ready(ready_key: str, hostname: str) -> None:
    _warmed.wait()
    try:
        announce_ready(settings, ready_key, hostname)
    except Exception:  # the launcher then reports the worker as not answering, with its log
        log.exception("could not announce readiness")


@worker_shutdown.connect
def _stop_sampler(**_: Any) -> None:
    if _sampler is not None:
        _sampler.stop()
