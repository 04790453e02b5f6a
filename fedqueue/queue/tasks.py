"""Celery tasks: one per job-kind handler. Decode the message, count the attempt, call the handler. Nothing else.

The rules every kind gets here: a message that is unsigned where the deployment signs, malformed, of a run
the store does not know, or not work its run sent (the kind's `refusal`) is dead-lettered once and never run; a
failure before the outcome is stored puts the message back (never an acked,
lost task); a broker or store outage is waited out, never counted against the
task; a handler that raises is retried up to `max_attempts`, and a task whose
workers vanish is sent again up to `max_lost_attempts`, then its kind's
`give_up` stores the failure; a task past the time limit ends the process; a task of a cancelled run is
skipped.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

import redis
from celery import Celery, Task
from celery.exceptions import Reject, Retry

from fedqueue.config import Settings
from fedqueue.core import jobs
from fedqueue.core.broker.dead_letters import dead_letter
from fedqueue.core.codec import MessageError
from fedqueue.core.connect import open_services
from fedqueue.core.infra_errors import infrastructure_fault
from fedqueue.core.runs.cancel import is_cancelled, run_of
from fedqueue.core.services import Services
from fedqueue.core.signing import verify
from fedqueue.core.waits.waiting import note_waiting
from fedqueue.queue.ask import answer_on, answering, reply_prefix
from fedqueue.queue.publish import enqueue_with
from fedqueue.queue.stopping import worker_stopping
from fedqueue.queue.watchdog import Watchdog

log = logging.getLogger(__name__)

# Before a message whose services failed goes back to the queue: a blip passes, a loop stays slow.
REQUEUE_PAUSE_S = 1.0
# A task that met a broker or store outage tries again after this pause, doubled each time up to the second.
OUTAGE_FIRST_PAUSE_S = 1.0
OUTAGE_MAX_PAUSE_S = 30.0
STOP_CHECK_S = 0.2  # how soon a task waiting out an outage notices its worker stopping
# How long a task waits for its worker's warm-up (about a second) before it goes ahead anyway.
WARM_UP_WAIT_S = 120.0


class WorkerState:
    """Connections, caches and the watchdog of one worker process; connections open at its first task."""

    def __init__(self, app: Celery, settings: Settings) -> None:
        self._app = app
        self._settings = settings
        self._lock = threading.Lock()
        self._services: Services | None = None
        self._caches: dict[str, object] = {}
        self._broker: redis.Redis | None = None
        self.watchdog = Watchdog(settings.task_time_limit_s)

    def services(self) -> Services:
        with self._lock:
            if self._services is None:
                self._services = open_services(self._settings, enqueue_with(self._app, self._settings), migrate=False)
            return self._services

    def broker(self) -> redis.Redis:
        """A plain client of the broker's Redis (dead letters, answers to questions)."""
        with self._lock:
            if self._broker is None:
                self._broker = redis.Redis.from_url(
                    self._settings.broker_url or "", socket_connect_timeout=3, socket_timeout=10
                )
            return self._broker

    def dead_letter(self, queue: str, why: str, body: Any) -> None:
        dead_letter(self.broker(), self._settings.key_prefix, queue, why, body)

    def cache(self, kind: jobs.JobKind) -> object:
        with self._lock:
            if kind.name not in self._caches:
                self._caches[kind.name] = kind.new_cache()
            return self._caches[kind.name]


def register_tasks(app: Celery, settings: Settings) -> WorkerState:
    state = WorkerState(app, settings)
    for kind, handler in jobs.handlers():
        _register(app, settings, state, kind, handler)
    for kind in jobs.kinds().values():
        for question in kind.questions:
            _register_question(app, settings, state, kind, question)
    return state


def _refusing(state: WorkerState, task: Task, name: str, raw: Any) -> Callable[[str], Reject]:
    def refuse(why: str) -> Reject:
        """Refused for good: dead-lettered once, acknowledged, never run or put back."""
        state.dead_letter(_queue_of(task), f"{name}: {why}", raw)
        return Reject(why, requeue=False)

    return refuse


def _check_envelope(
    settings: Settings, name: str, raw: Any, signature: Any, unexpected: dict[str, Any], refuse: Callable[[str], Reject]
) -> None:
    """What every task checks first: no arguments beside its message and signature, and the signature where the
    deployment signs."""
    if unexpected:
        raise refuse(f"unexpected arguments {', '.join(sorted(unexpected))}")
    if settings.message_key is not None and not verify(settings.message_key, name, raw, signature):
        raise refuse("unsigned, or not signed with this deployment's FEDQUEUE_MESSAGE_KEY")


def _register_question(
    app: Celery, settings: Settings, state: WorkerState, kind: jobs.JobKind, question: jobs.Question
) -> None:
    @app.task(name=question.name, bind=True, ignore_result=True)
    def answer_task(self: Task, raw: Any, signature: Any = None, **unexpected: Any) -> None:
        refuse = _refusing(state, self, question.name, raw)
        _check_envelope(settings, question.name, raw, signature, unexpected, refuse)
        reply = raw.get("reply") if isinstance(raw, dict) else None
        # Answers go only to the deployment's own reply keys, never to a key the message names at will.
        if not isinstance(reply, str) or not reply.startswith(reply_prefix(settings)):
            raise refuse("malformed: no reply key of this deployment")
        if not isinstance(raw.get("question"), dict):
            raise refuse("malformed: no question")
        with answering(state.broker(), reply):  # taken: its asker waits for the answer, not for a taker
            jobs.wait_for_warm_up(WARM_UP_WAIT_S)
            # Under the time limit as every task (a plugin that hangs ends the process; the asker then stops waiting).
            with state.watchdog.watching(question.name, lambda: None), kind.task_scope(settings):
                answer_on(state.broker(), state.services().blobs, question, raw)


def _requeue(reason: str) -> Reject:
    time.sleep(REQUEUE_PAUSE_S)
    return Reject(reason, requeue=True)


def _register(
    app: Celery, settings: Settings, state: WorkerState, kind: jobs.JobKind, handler: jobs.TaskHandler
) -> None:
    @app.task(name=handler.name, bind=True, acks_late=True, ignore_result=True)
    def run_task(self: Task, raw: Any, signature: Any = None, **unexpected: Any) -> None:
        refuse = _refusing(state, self, handler.name, raw)
        _check_envelope(settings, handler.name, raw, signature, unexpected, refuse)
        try:
            message = handler.message_type.from_dict(raw)  # type: ignore[attr-defined]
        except MessageError as err:
            log.error("rejected malformed task message: %s (%s)", err, handler.name)
            raise refuse(f"malformed: {err}") from None
        worker = self.request.hostname or "unknown"
        key = message.attempt_key
        try:
            services = state.services()
            refused = _refusal(services, handler, state.cache(kind), message)
            if refused is None:
                attempt = services.ledger.start_attempt(key, worker)
        except Exception as err:  # nothing stored and nothing counted: the message must not be acked
            log.warning("%s %s: services unavailable (%s); message put back", handler.name, key, err)
            raise _requeue(str(err)) from None
        if refused is not None:
            log.error("%s %s: refused, not work its run sent: %s", handler.name, key, refused)
            raise refuse(refused)
        context = jobs.TaskContext(services=services, worker=worker, attempt=attempt, cache=state.cache(kind))

        def on_timeout() -> None:
            services.ledger.mark_timed_out(key)
            # The time limit counts as an error of the task's own: the watchdog ends the process next.
            if services.ledger.count_raised(key) >= settings.max_attempts:
                handler.give_up(context, message, attempt, f"time limit exceeded ({settings.task_time_limit_s} s)")

        run_id = run_of(message)

        def run_once() -> None:
            if run_id and is_cancelled(services.store, run_id):  # read through outages, as the task's own reads
                log.info("%s %s: run %s was cancelled; skipped", handler.name, key, run_id)
                return
            # A kind's scope and task import torch's compiler modules (use_deterministic_algorithms does), which
            # must not be imported beside the worker's warm-up thread: only a process's first tasks wait here.
            jobs.wait_for_warm_up(WARM_UP_WAIT_S)
            with state.watchdog.watching(f"{handler.name} {message.label}", on_timeout), kind.task_scope(settings):
                handler.run(context, message)

        try:
            with services.ledger.heartbeat(key, worker):
                # A task whose workers keep vanishing comes back with no exception to count: cap it here.
                if attempt > 1 and services.ledger.used_up(key, attempt - 1):
                    handler.give_up(context, message, attempt - 1, services.ledger.lost_reason(key, attempt - 1))
                    return
                _through_outages(
                    f"{handler.name} {key}",
                    run_once,
                    settings.broker_wait_s,
                    lambda fault: note_waiting(services, run_id, fault) if run_id else None,
                )
        except Exception as err:
            _after_failure(self, services, settings, handler, context, message, err, refuse)


def _queue_of(task: Task) -> str:
    info = task.request.delivery_info or {}
    return str(info.get("routing_key") or info.get("exchange") or "?")


def _refusal(services: Services, handler: jobs.TaskHandler, cache: object, message: object) -> str | None:
    """Why a well-formed message is not work to run: its run unknown to the store, or its kind's own reason."""
    run_id = run_of(message)
    if run_id and services.store.run_state(run_id) is None:
        return _unknown_run(run_id)
    return None if handler.refusal is None else handler.refusal(services, cache, message)


def _unknown_run(run_id: str) -> str:
    return f"run {run_id} is not in the store (the store was reset, or the message was forged)"


def _through_outages(
    label: str, run_once: Callable[[], None], wait_limit_s: float, on_fault: Callable[[str], None]
) -> None:
    """Run a task, and again after an infrastructure error (the broker or store failed, not the task's code).

    The same delivery tries again in this process, with backoff: no attempt is used up, no message is
    written to a broker that may be full or gone, and the result is the same since tasks are idempotent.
    Past `wait_limit_s` the error goes to `_after_failure`, which puts the message back uncounted.
    """
    waited = 0.0
    pause = OUTAGE_FIRST_PAUSE_S
    while True:
        try:
            run_once()
            if waited:
                log.warning("%s: went through after %.0f s of waiting for the infrastructure", label, waited)
            return
        except Exception as err:
            fault = infrastructure_fault(err)
            if fault is None or waited >= wait_limit_s or worker_stopping():
                raise
            log.warning("%s: %s (%s); waiting %.0f s, then trying again (no attempt used)", label, fault, err, pause)
            on_fault(fault)
            waited += _pause_unless_stopping(pause)
            pause = min(pause * 2, OUTAGE_MAX_PAUSE_S)


def _pause_unless_stopping(pause_s: float) -> float:
    """Sleep `pause_s` in short steps, cut short if the worker is asked to stop; returns the time slept."""
    began = time.monotonic()
    while time.monotonic() - began < pause_s and not worker_stopping():
        time.sleep(min(STOP_CHECK_S, pause_s))
    return time.monotonic() - began


def _after_failure(
    task: Task,
    services: Services,
    settings: Settings,
    handler: jobs.TaskHandler,
    context: jobs.TaskContext,
    message: Any,
    err: Exception,
    refuse: Callable[[str], Reject],
) -> None:
    """Retry a failed attempt, or store the failure once attempts are used up; never lose the message.

    An infrastructure error that outlasted the wait is not the task's: its attempt is given back and
    the message put back. Only errors the task's own code raised count towards `max_attempts`.
    A run the store no longer knows is refused for good (`refuse`): put back, it would come back forever.
    """
    key = message.attempt_key
    fault = infrastructure_fault(err)
    if fault is not None:
        log.warning("%s %s: %s for too long (%s); message put back, attempt not counted", handler.name, key, fault, err)
        with contextlib.suppress(Exception):  # the ledger may sit on the broker that failed
            services.ledger.take_back_attempt(key)
        raise _requeue(str(err)) from None
    try:
        raised = services.ledger.count_raised(key)
        if raised < settings.max_attempts:
            log.warning("%s %s failed (attempt %d), retrying: %s", handler.name, key, context.attempt, err)
            services.ledger.hold(key, context.worker)
            raise task.retry(exc=err, countdown=1, max_retries=None)
        handler.give_up(context, message, context.attempt, "".join(traceback.format_exception(err)))
    except Retry:
        raise
    except Exception as storing:  # the outcome could not be stored: the next delivery tries again
        run_id = run_of(message)
        gone = False
        with contextlib.suppress(Exception):  # a store that fails the look: put back as before
            gone = bool(run_id) and services.store.run_state(run_id) is None
        if gone:
            raise refuse(_unknown_run(run_id)) from None
        log.warning("%s %s: outcome not stored (%s); message put back", handler.name, key, storing)
        raise _requeue(str(storing)) from None
