"""The Redis transport's writes wait for room in a Redis at its maxmemory: a late ack refused for want of memory
is made once room is, and the channel then takes the next message (before, kombu logged "Couldn't ack" and kept
the message as held: with a prefetch of one, its worker never took another task)."""

from __future__ import annotations

import threading
from dataclasses import replace

import pytest
import redis

from fedqueue.config import Settings
from fedqueue.core.broker import keys
from fedqueue.queue import redis_transport
from fedqueue.queue.app import make_app
from fedqueue.queue.embedded import EmbeddedRedis
from tests.support.reliability_support import wait_until


def oom_replies(client: redis.Redis) -> int:
    return int(client.info("errorstats").get("errorstat_OOM", {}).get("count", 0))


def test_a_late_ack_refused_by_a_full_redis_waits_for_room_and_the_channel_takes_the_next_message(
    settings: Settings,
) -> None:
    with EmbeddedRedis(extra_args=["--maxmemory-policy", "noeviction"]) as server:
        client = redis.Redis.from_url(server.url)
        app = make_app(replace(settings, broker_url=server.url))
        connection = app.connection_for_read()
        try:
            channel = connection.default_channel
            assert isinstance(channel, redis_transport.Channel)
            channel.basic_qos(0, 1, False)  # a prefetch of one, as a worker's
            queue = connection.SimpleQueue("acks")
            queue.put({"n": 1})
            queue.put({"n": 2})
            first = queue.get(timeout=5)
            assert not channel.qos.can_consume()  # holding one
            client.config_set("maxmemory", 1)  # at its limit: every write that may grow it is refused
            refused = oom_replies(client)
            acked = threading.Event()

            def ack() -> None:
                first.ack()
                acked.set()

            threading.Thread(target=ack, daemon=True).start()
            wait_until(lambda: oom_replies(client) > refused + 1, 10)  # refused, and tried again
            assert not acked.is_set()  # waiting, not dropped
            client.config_set("maxmemory", 0)  # room made
            wait_until(acked.is_set, 10)
            unacked = f"{keys.celery_prefix(settings.key_prefix)}unacked"
            assert client.hlen(unacked) == 0  # acknowledged in Redis, not only in the channel
            assert channel.qos.can_consume()
            assert queue.get(timeout=5).payload == {"n": 2}
        finally:
            connection.close()
            client.close()


def test_a_write_still_refused_past_the_wait_raises_and_the_pauses_grow() -> None:
    pauses: list[float] = []

    def refused() -> None:
        raise redis.exceptions.OutOfMemoryError("command not allowed when used memory > 'maxmemory'.")

    now = [0.0]

    def sleep(seconds: float) -> None:
        pauses.append(seconds)
        now[0] += seconds

    with pytest.raises(redis.exceptions.OutOfMemoryError):
        redis_transport.when_room("a write", refused, wait_s=20.0, sleep=sleep, clock=lambda: now[0])
    assert pauses == [0.25, 0.5, 1.0, 2.0, 4.0, 5.0, 5.0, 2.25]  # up to the wait, then the refusal
    assert redis_transport.when_room("a write", lambda: 7, wait_s=0.0) == 7
