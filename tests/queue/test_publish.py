"""Publishing a round's messages: the first few reach the queue before the rest are built.

On real Redis, through the Celery app that the scheduler uses; nothing consumes.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import redis

from fedqueue.config import Settings
from fedqueue.core.jobs import CONTROL_QUEUE
from fedqueue.fl.messages import AggregateTask
from fedqueue.queue import publish
from fedqueue.queue.app import make_app


def _counting(settings: Settings) -> tuple[Any, redis.Redis, str, list[int]]:
    """The app, a Redis client, the control queue, and how many messages wait there as each one is built."""
    app = make_app(settings)
    assert settings.broker_url is not None  # the settings fixture's test Redis
    client = redis.Redis.from_url(settings.broker_url)
    queue = f"{settings.key_prefix}:{settings.queue(CONTROL_QUEUE)}"
    waiting_when_built: list[int] = []
    send_task = app.send_task

    def send_counting(*args: Any, **kwargs: Any) -> Any:
        waiting_when_built.append(int(client.llen(queue)))  # type: ignore[arg-type]
        return send_task(*args, **kwargs)

    app.send_task = send_counting  # type: ignore[method-assign]
    return app, client, queue, waiting_when_built


def test_the_first_messages_are_on_the_queue_while_the_rest_are_built(settings: Settings) -> None:
    app, client, queue, waiting_when_built = _counting(settings)
    messages = [AggregateTask(run_id="r" * 12, round_index=index, enqueued_at=0.0) for index in range(1, 21)]
    try:
        publish.enqueue_with(app, settings)(messages)
        # Nothing is on the queue while the first batch is built; all of it while the rest is.
        first = publish.FIRST_BATCH
        assert waiting_when_built == [0] * first + [first] * (len(messages) - first)
        bodies = [json.loads(raw) for raw in client.lrange(queue, 0, -1)]  # type: ignore[union-attr]
        # Every message once, and in the order given (the queue pops from its right end).
        rounds = [json.loads(_decoded(body))[0][0]["round_index"] for body in reversed(bodies)]
        assert rounds == list(range(1, 21))
    finally:
        client.delete(queue)
        app.close()


def test_a_few_messages_go_out_in_one_round_trip(settings: Settings) -> None:
    """A buffered-async refill of a few tasks: built first, then sent in one pipeline, not two."""
    app, client, queue, waiting_when_built = _counting(settings)
    count = publish.SPLIT_ABOVE
    try:
        publish.enqueue_with(app, settings)(
            [AggregateTask(run_id="r" * 12, round_index=index, enqueued_at=0.0) for index in range(1, count + 1)]
        )
        assert waiting_when_built == [0] * count
        assert client.llen(queue) == count
    finally:
        client.delete(queue)
        app.close()


def _decoded(body: dict[str, Any]) -> str:
    import base64

    raw = body["body"]
    return base64.b64decode(raw).decode() if body.get("properties", {}).get("body_encoding") == "base64" else raw


@pytest.mark.parametrize("count", [0, 1, publish.FIRST_BATCH, publish.SPLIT_ABOVE, publish.SPLIT_ABOVE + 1])
def test_every_message_is_published_once(settings: Settings, count: int) -> None:
    app = make_app(settings)
    assert settings.broker_url is not None  # the settings fixture's test Redis
    client = redis.Redis.from_url(settings.broker_url)
    queue = f"{settings.key_prefix}:{settings.queue(CONTROL_QUEUE)}"
    try:
        publish.enqueue_with(app, settings)(
            [AggregateTask(run_id="r" * 12, round_index=index, enqueued_at=0.0) for index in range(1, count + 1)]
        )
        assert client.llen(queue) == count
    finally:
        client.delete(queue)
        app.close()
