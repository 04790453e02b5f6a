"""Questions to any worker (`jobs.Question`): sent on the control queue, answered through the broker.

The asker waits first for a worker to take the question (a key the worker keeps alive while it answers), then for
the answer: a line of JSON on a Redis list, its bytes a blob (shared memory on one host, else Redis under its
budget or the store, as every blob); a question nobody took in time, whose worker went quiet, or that failed
there is answered with None, and the asker does the work itself. So a cluster whose workers are busy, gone or older than the asker costs a
short wait, never a wrong answer: the answer is what the asker would have computed (the same code, the same
JSON), only where torch is loaded already.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import asdict
from typing import Any, cast

import redis
from celery import Celery

from fedqueue.config import Settings
from fedqueue.core import jobs
from fedqueue.core.broker import keys
from fedqueue.core.broker.blobs import BlobStore
from fedqueue.core.codec import BlobRef
from fedqueue.core.services import AskWorkers
from fedqueue.queue.publish import signature_kwargs

log = logging.getLogger(__name__)

ALIVE_TTL_S = 5.0  # the worker's mark that it is answering lapses this long after its last refresh ...
ALIVE_REFRESH_S = 1.0  # ... which comes this often
ANSWER_TTL_S = 120  # an answer nobody collects (its asker gone) leaves the broker after this
POLL_S = 0.05  # how often the asker looks for a taker


def reply_prefix(settings: Settings) -> str:
    return f"{settings.key_prefix}:ask:"


def ask_with(app: Celery, settings: Settings, take_within_s: float, blobs: BlobStore) -> AskWorkers:
    """Asks on this app's broker; a question no worker took within `take_within_s` (0: never asked) gets None.
    `blobs`: where answers' bytes are read, the blob store the workers put them in."""

    def ask(name: str, question: dict[str, Any]) -> tuple[dict[str, Any], bytes] | None:
        if take_within_s <= 0 or not settings.broker_url:
            return None
        reply = f"{reply_prefix(settings)}{uuid.uuid4().hex}"
        body = {"question": question, "reply": reply}
        client = redis.Redis.from_url(settings.broker_url, socket_connect_timeout=3, socket_timeout=10)
        try:
            sent = app.send_task(
                name,
                args=[body],
                kwargs=signature_kwargs(settings, name, body),
                queue=settings.queue(jobs.CONTROL_QUEUE),
                expires=take_within_s,  # not taken by then: the asker does it itself, and no worker should
                retry=False,
                argsrepr=name,
                kwargsrepr="{}",
            )
            answer = _answer(client, blobs, reply, take_within_s)
            if answer is None:
                _withdraw(client, settings, sent.id)
            return answer
        except Exception as err:  # a broker that fails here fails the asker's own work next, with its own message
            log.info("%s: no worker's answer (%s); done here", name, err)
            return None
        finally:
            with contextlib.suppress(redis.RedisError):
                client.delete(f"{reply}:alive", f"{reply}:answer")
            client.close()

    return ask


def _answer(
    client: redis.Redis, blobs: BlobStore, reply: str, take_within_s: float
) -> tuple[dict[str, Any], bytes] | None:
    deadline = time.monotonic() + take_within_s
    while not client.exists(f"{reply}:alive", f"{reply}:answer"):
        if time.monotonic() > deadline:
            return None
        time.sleep(POLL_S)
    while True:
        popped = client.blpop([f"{reply}:answer"], timeout=ALIVE_REFRESH_S)
        if popped is not None:
            break
        if not client.exists(f"{reply}:alive", f"{reply}:answer"):
            return None  # its worker stopped answering (killed, or its broker connection lost)
    header = json.loads(popped[1])
    if not header.get("ok"):
        log.info("a worker could not answer: %s; done here", header.get("error"))
        return None
    ref = BlobRef.from_dict(header["blob"])
    try:
        return header["answer"], blobs.get(ref)  # checked against its sha256
    finally:
        blobs.delete([ref.key])


def _withdraw(client: redis.Redis, settings: Settings, task_id: str) -> None:
    """The question taken out of its queue where no worker took it: a queue that holds messages tells a later
    command that no worker reads it, and a worker started later has nobody to answer."""
    queue = keys.queue_list(settings.key_prefix, settings.queue(jobs.CONTROL_QUEUE))
    marker = task_id.encode()
    for raw in client.lrange(queue, 0, -1):
        if isinstance(raw, bytes) and marker in raw:
            client.lrem(queue, 1, cast(str, raw))  # the very bytes read (redis-py takes bytes too)


def answer_on(client: redis.Redis, blobs: BlobStore, question: jobs.Question, body: dict[str, Any]) -> None:
    """A worker's side, inside `answering`: answer the question, and leave the answer (or why not) for its asker.
    Nothing raises: an asker that gets no answer does the work itself."""
    reply = body["reply"]
    try:
        answer, data = question.answer(body["question"])
        ref = blobs.put(f"{reply.rsplit(':', 1)[-1]}:answer", data)
        header: dict[str, Any] = {"ok": True, "answer": answer, "blob": asdict(ref)}
    except Exception as err:  # the asker does it itself, and meets the same error with its own message
        log.warning("%s: %s: %s", question.name, type(err).__name__, err)
        header = {"ok": False, "error": f"{type(err).__name__}: {err}"}
    try:
        with client.pipeline(transaction=True) as pipe:
            pipe.rpush(f"{reply}:answer", json.dumps(header))
            pipe.expire(f"{reply}:answer", ANSWER_TTL_S)
            pipe.execute()
    except redis.RedisError as err:  # a full or lost broker: the asker stops waiting once `alive` lapses
        log.warning("%s: answer not left (%s)", question.name, err)


@contextlib.contextmanager
def answering(client: redis.Redis, reply: str) -> Iterator[None]:
    """The question marked taken for its asker while the block runs (a mark that lapses if this process dies)."""
    key = f"{reply}:alive"
    stop = threading.Event()

    def refresh() -> None:
        while True:
            with contextlib.suppress(redis.RedisError):
                client.set(key, b"1", px=int(ALIVE_TTL_S * 1000))
            if stop.wait(ALIVE_REFRESH_S):
                return

    with contextlib.suppress(redis.RedisError):
        client.set(key, b"1", px=int(ALIVE_TTL_S * 1000))
    thread = threading.Thread(target=refresh, daemon=True, name="answering")
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
        with contextlib.suppress(redis.RedisError):
            client.delete(key)
