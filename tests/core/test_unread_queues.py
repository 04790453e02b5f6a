"""fedqueue.core.broker.readers on a real Redis (marks kept, removed, run out) and fedqueue.core.waits.unread's lines."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence

import redis

from fedqueue.config import Settings
from fedqueue.core.broker.readers import QueueLook, ReaderMarks, look, looker
from fedqueue.core.waits.room import BrokerRoom
from fedqueue.core.waits.unread import LOOK_EVERY_S, UnreadQueues
from fedqueue.queue.embedded import EmbeddedRedis
from tests.support.reliability_support import wait_until


def test_workers_marks_are_counted_while_kept_and_not_once_removed_or_run_out() -> None:
    server = EmbeddedRedis().start()
    client = redis.Redis.from_url(server.url)
    try:
        client.rpush("p:p.devices", "a message")
        assert look(client, "p", ["p.devices", "p.control"]) == [
            QueueLook("p.devices", 1, 0),
            QueueLook("p.control", 0, 0),
        ]
        kept = ReaderMarks(client, "p", ["p.devices", "p.control"], "cpu0@host", ttl_s=30).start()
        dying = ReaderMarks(client, "p", ["p.devices"], "cpu1@host", ttl_s=1).start()
        assert [seen.readers for seen in look(client, "p", ["p.devices", "p.control"])] == [2, 1]
        dying._stopped.set()  # a worker killed: its marks are no longer renewed, and run out
        time.sleep(1.5)
        assert [seen.readers for seen in look(client, "p", ["p.devices", "p.control"])] == [1, 1]
        kept.stop()  # a worker that stops removes its marks at once
        assert [seen.readers for seen in look(client, "p", ["p.devices", "p.control"])] == [0, 0]
    finally:
        client.close()
        server.stop()


def test_a_follower_says_once_that_no_worker_reads_says_it_again_on_a_change_and_when_one_reads() -> None:
    now = [0.0]
    lines: list[str] = []
    seen = {"q.control": QueueLook("q.control", 0, 0), "q.devices": QueueLook("q.devices", 3, 0)}

    def looked(queues: Sequence[str]) -> list[QueueLook]:
        return [seen[queue] for queue in queues]

    watch = UnreadQueues("r1", lambda: ["q.control", "q.devices"], looked, 60, lines.append, clock=lambda: now[0])

    def at(seconds: float) -> None:
        now[0] = seconds
        watch.check()

    at(0)
    at(59)
    assert lines == []  # not yet for FEDQUEUE_NO_WORKER_S
    at(61)
    assert lines == ["no worker reads queue q.devices: start `fedqueue worker`"]
    at(61 + LOOK_EVERY_S)
    at(100)
    assert len(lines) == 1  # the same: nothing more
    seen["q.control"] = QueueLook("q.control", 1, 0)
    at(103)
    at(170)
    assert lines[1:] == ["no worker reads queues q.control, q.devices: start `fedqueue worker`"]
    seen["q.control"] = QueueLook("q.control", 0, 1)
    seen["q.devices"] = QueueLook("q.devices", 2, 1)
    at(180)
    assert lines[2:] == ["a worker reads queues q.control, q.devices again: run r1 goes on"]
    at(300)
    assert len(lines) == 3


def test_queues_are_not_called_unread_while_the_broker_is_full_and_their_wait_restarts_once_it_has_room() -> None:
    now = [0.0]
    lines: list[str] = []
    full = [False]
    seen = {"q.devices": QueueLook("q.devices", 3, 0)}

    def looked(queues: Sequence[str]) -> list[QueueLook]:
        return [seen[queue] for queue in queues]

    watch = UnreadQueues("r1", lambda: ["q.devices"], looked, 60, lines.append, lambda: now[0], lambda: full[0])

    def at(seconds: float) -> None:
        now[0] = seconds
        watch.check()

    at(0)
    full[0] = True
    at(30)
    at(200)
    assert lines == []  # unread for 200 s, but the broker was full all along: nothing said
    full[0] = False
    at(202)
    at(261)
    assert lines == []  # its wait counts from the first look with room
    at(263)
    assert lines == ["no worker reads queue q.devices: start `fedqueue worker`"]


def test_a_worker_whose_marks_run_out_in_a_full_broker_is_not_called_gone_and_reads_again_once_room_is_made() -> None:
    """A real Redis past its maxmemory refuses a worker's renewals of its reader marks (ZADD is a write that may
    grow memory), so they run out while the worker waits for room: the follower's looks see no reader."""
    with EmbeddedRedis() as server:
        client = redis.Redis.from_url(server.url)
        client.rpush("fq:fq.devices", "a task")  # waits on the queue, as a run's next tasks do
        marks = ReaderMarks(client, "fq", ["fq.devices"], "cpu0@host", ttl_s=2).start()
        client.config_set("maxmemory-policy", "noeviction")
        client.config_set("maxmemory", str(int(client.info("memory")["used_memory"]) + 2**20))
        filled = 0
        with contextlib.suppress(redis.exceptions.OutOfMemoryError):
            while True:
                client.set(f"junk:{filled}", b"x" * 65536)
                filled += 1
        # Held past its limit, as another client's writes keep it: every renewal is refused. A quarter MiB under
        # what it holds, more than a refused write's buffer gives back once freed (which left room for small ones).
        client.config_set("maxmemory", str(int(client.info("memory")["used_memory"]) - 2**18))
        wait_until(lambda: look(client, "fq", ["fq.devices"])[0].readers == 0, 10)  # the marks ran out
        now = [0.0]
        lines: list[str] = []
        room = BrokerRoom.of(Settings(broker_url=server.url), "run-a", lines.append, clock=lambda: now[0])
        assert room is not None
        unread = UnreadQueues(
            "run-a",
            lambda: ["fq.devices"],
            looker(server.url, "fq"),
            60,
            lines.append,
            lambda: now[0],
            lambda: room.full,
        )

        def tick(seconds: float) -> None:  # as the follower's supervisor: the room first, then the queues
            now[0] = seconds
            room.check()
            unread.check()

        for seconds in range(0, 300, 2):
            tick(seconds)
        assert len(lines) == 1 and lines[0].startswith("broker out of memory ("), lines
        client.delete(*[f"junk:{index}" for index in range(filled)])
        wait_until(lambda: look(client, "fq", ["fq.devices"])[0].readers == 1, 10)  # renewed once there was room
        for seconds in range(300, 400, 2):
            tick(seconds)
        assert lines[1:] == ["broker has room again after 300 s: run run-a goes on"], lines
        marks.stop()  # the worker really goes: that is said once its wait is over
        for seconds in range(400, 470, 2):
            tick(seconds)
        assert lines[2:] == ["no worker reads queue fq.devices: start `fedqueue worker`"], lines
        room.close()
        client.close()
