"""Learning the worker slots a job will run on, and waking its follower when a batch is stored."""

from __future__ import annotations

import time

from fedqueue.config import Settings
from fedqueue.core.connect import open_services
from fedqueue.llm.slots import answering_slots, llm_slots
from fedqueue.llm.wake import announce_stored, stored_key, stored_waiter
from tests.support.helpers import broker_redis

LLM = "fq.llm"


def test_only_workers_reading_the_llm_queue_count_with_their_pool_sizes() -> None:
    stats = [{"gpu0@a": {"pool": {"max-concurrency": 3}}}, {"cpu0@b": {"pool": {"max-concurrency": 1}}}]
    stats.append({"fl-only@c": {"pool": {"max-concurrency": 8}}})
    queues = [
        {"gpu0@a": [{"name": "fq.control"}, {"name": LLM}]},
        {"cpu0@b": [{"name": LLM}]},
        {"fl-only@c": [{"name": "fq.control"}, {"name": "fq.devices"}]},
        {"late@d": [{"name": LLM}]},  # its pool size did not arrive: one slot
    ]
    assert llm_slots(stats, queues, LLM) == 3 + 1 + 1
    assert llm_slots(stats, queues[2:3], LLM) is None
    assert llm_slots([], [], LLM) is None


def test_no_worker_on_the_broker_answers_none(settings: Settings) -> None:
    began = time.monotonic()
    assert answering_slots(settings) is None
    assert time.monotonic() - began < 1.0  # stops a short gap after the last answer, not a fixed second


def test_a_stored_batch_wakes_the_follower_before_its_timeout(settings: Settings) -> None:
    services = open_services(settings, lambda messages: None, migrate=True)
    try:
        wait = stored_waiter(services, "job-1")
        announce_stored(services, "job-1")
        announce_stored(services, "job-1")
        began = time.monotonic()
        wait(30.0)
        assert time.monotonic() - began < 5.0
        assert not broker_redis(services).exists(stored_key(settings.key_prefix, "job-1"))  # both stores woke it once
    finally:
        services.close()
