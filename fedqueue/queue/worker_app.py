"""The app a `celery worker` process loads (`-A fedqueue.queue.worker_app`); settings come from the environment."""

from typing import Any

from celery.signals import worker_init, worker_ready, worker_shutdown

from fedqueue.config import Settings
from fedqueue.core import jobs
from fedqueue.core.utilization import Sampler
from fedqueue.queue.app import make_app
from fedqueue.queue.tasks import register_tasks

settings = Settings.from_env()
settings.activate_plugin_path()
app = make_app(settings)
state = register_tasks(app, settings)
_sampler: Sampler | None = None


@worker_init.connect
def _warm_up(**_: Any) -> None:
    # Before the worker consumes (and before it answers pings): the first task then runs at full speed.
    for kind in jobs.select(settings.jobs):
        if kind.warm_up is not None:
            kind.warm_up(settings)


@worker_ready.connect
def _start_sampler(sender: Any = None, **_: Any) -> None:
    # Started here, not at import: only a consuming worker samples, under the hostname its tasks record.
    global _sampler
    _sampler = Sampler(settings.database_url, getattr(sender, "hostname", None) or "unknown").start()


@worker_shutdown.connect
def _stop_sampler(**_: Any) -> None:
    if _sampler is not None:
        _sampler.stop()
