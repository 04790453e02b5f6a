"""The app a `celery worker` process loads (`-A fedqueue.queue.worker_app`); settings come from the environment."""

import logging
import os
import threading
import time
from typing import Any

import redis
from celery.signals import worker_init, worker_ready, worker_shutdown

from fedqueue.config import Settings
from fedqueue.core import jobs
from fedqueue.core.broker.readers import ReaderMarks
from fedqueue.core.process.kept_memory import keep_freed_memory
from fedqueue.core.process.utilization import Probe, Sampler, make_probe
from fedqueue.queue.app import make_app
from fedqueue.queue.readiness import READY_KEY_ENV, announce_ready
from fedqueue.queue.tasks import WARM_UP_WAIT_S, register_tasks

log = logging.getLogger(__name__)

settings = Settings.from_env()
settings.activate_plugin_path()
# Before any task allocates: a model's states and gradients then reuse the pages of the last ones.
if keep_freed_memory(settings.worker_freed_memory_mb):
    log.info("keeps up to %d MiB of freed memory for reuse", settings.worker_freed_memory_mb)
app = make_app(settings)
state = register_tasks(app, settings)
_sampler: Sampler | None = None
_reader_marks: ReaderMarks | None = None
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
    global _sampler, _reader_marks
    hostname = getattr(sender, "hostname", None) or "unknown"
    _sampler = Sampler(settings.database_url, hostname, probe_factory=_probe_after_warm_up).start()
    _reader_marks = _mark_queues(hostname)
    ready_key = os.environ.get(READY_KEY_ENV)  # set by fedqueue's launcher, not a user setting
    if ready_key:
        threading.Thread(target=_say_ready, args=(ready_key, hostname), name="fedqueue-ready", daemon=True).start()


def _probe_after_warm_up() -> Probe:
    # The probe's CUDA check imports torch: not beside the warm-up's first imports of it, which two threads
    # must not make at once (one can meet a torch module the other has half made, and the warm-up failed so).
    _warmed.wait(WARM_UP_WAIT_S)
    return make_probe()


def _say_ready(ready_key: str, hostname: str) -> None:
    _warmed.wait()
    try:
        announce_ready(settings, ready_key, hostname)
    except Exception:  # the launcher then reports the worker as not answering, with its log
        log.exception("could not announce readiness")


def _mark_queues(hostname: str) -> ReaderMarks | None:
    """Marks on the queues this worker consumes (its -Q), so followers know someone reads them (core.broker.readers)."""
    client = redis.Redis.from_url(settings.broker_url or "", socket_connect_timeout=3, socket_timeout=5)
    queues = sorted(app.amqp.queues.consume_from)
    try:
        return ReaderMarks(client, settings.key_prefix, queues, hostname, settings.heartbeat_ttl_s).start()
    except Exception:  # followers may then say that no worker reads; the tasks run all the same
        log.exception("could not start the queue reader marks")
        return None


@worker_shutdown.connect
def _stop_sampler(**_: Any) -> None:
    if _reader_marks is not None:
        _reader_marks.stop()
    if _sampler is not None:
        _sampler.stop()
