"""What a run waits for during an outage: a worker's note, or the broker's own memory at its limit (a real
Redis's refusal, which must read as an outage, never as the task's own error)."""

from __future__ import annotations

import contextlib

import redis

from fedqueue.config import Settings
from fedqueue.core.infra_errors import infrastructure_fault
from fedqueue.core.services import connect_redis
from fedqueue.core.waits.room import LOOK_EVERY_S, BrokerRoom
from fedqueue.core.waits.waiting import note_waiting, waiting_for
from fedqueue.queue.client import open_client_services
from fedqueue.queue.embedded import EmbeddedRedis


def test_a_worker_s_note_names_the_outage_until_it_expires(settings: Settings) -> None:
    services = open_client_services(settings, worker_slots=dict)
    client = connect_redis(settings.broker_url or "")
    try:
        assert waiting_for(client, settings.key_prefix, "run-a") is None
        note_waiting(services, "run-a", "store: disk full")
        assert waiting_for(client, settings.key_prefix, "run-a") == "store: disk full; waiting"
        assert waiting_for(client, settings.key_prefix, "run-b") is None
        assert 0 < int(client.ttl(f"{settings.key_prefix}:waiting:run-a")) <= 90  # gone soon after the outage
    finally:
        client.close()
        services.close()


def test_a_broker_at_its_maxmemory_is_named_with_its_numbers() -> None:
    with EmbeddedRedis() as server:
        client = redis.Redis.from_url(server.url)
        client.config_set("maxmemory-policy", "noeviction")
        client.config_set("maxmemory", str(int(client.info("memory")["used_memory"]) + 2**20))
        assert waiting_for(client, "fq", "run-a") is None
        filled = 0
        try:
            while True:  # fill it as a burst of updates would, until it refuses writes
                client.set(f"junk:{filled}", b"x" * 65536)
                filled += 1
        except redis.ResponseError as err:
            assert infrastructure_fault(err) == "broker out of memory"
        line = waiting_for(client, "fq", "run-a") or ""
        assert line.startswith("broker out of memory: maxmemory ") and line.endswith("; waiting"), line
        client.close()


def test_a_follower_says_once_when_its_broker_fills_and_once_when_it_has_room_again() -> None:
    """PING answers a full Redis: only its memory tells the follower, which says so once each way."""
    with EmbeddedRedis() as server:
        client = redis.Redis.from_url(server.url)
        client.config_set("maxmemory-policy", "noeviction")
        client.config_set("maxmemory", str(int(client.info("memory")["used_memory"]) + 2**20))
        said: list[str] = []
        now = [0.0]
        room = BrokerRoom.of(Settings(broker_url=server.url), "run-a", said.append, clock=lambda: now[0])
        assert room is not None

        def look() -> None:
            now[0] += LOOK_EVERY_S
            room.check()

        look()
        assert said == []
        filled = 0
        with contextlib.suppress(redis.exceptions.OutOfMemoryError):
            while True:
                client.set(f"junk:{filled}", b"x" * 65536)
                filled += 1
        look()
        look()
        assert len(said) == 1 and said[0].startswith("broker out of memory (maxmemory "), said
        assert said[0].endswith("): its tasks wait for room; the workers keep them"), said
        client.delete(*[f"junk:{index}" for index in range(filled)])
        look()
        look()
        assert said[1:] == [f"broker has room again after {2 * LOOK_EVERY_S:.0f} s: run run-a goes on"], said
        room.close()
        client.close()
