"""fedqueue.core.readers on a real Redis (marks kept, removed, run out) and fedqueue.core.unread's lines."""

from __future__ import annotations

import time
from collections.abc import Sequence

import redis

from fedqueue.core.readers import QueueLook, ReaderMarks, look
from fedqueue.core.unread import LOOK_EVERY_S, UnreadQueues
from fedqueue.queue.embedded import EmbeddedRedis


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
