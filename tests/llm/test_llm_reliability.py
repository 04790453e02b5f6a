"""An LLM job survives a worker killed in the middle of a batch: real launcher, real workers, real Redis."""

from __future__ import annotations

import json
import os
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from fedqueue import api
from fedqueue.config import Settings
from fedqueue.core.services import connect_redis
from fedqueue.llm.job import JobRequest, submit_job
from fedqueue.llm.messages import batch_task_name
from fedqueue.llm.results import prompt_rows
from fedqueue.llm.settings import GenerationSettings
from fedqueue.queue.client import open_client_services
from tests.llm.test_llm_queue import expected_outputs
from tests.support.reliability_support import launcher, pid_of_worker, reliable_settings, wait_until, worker_children

GENERATION = GenerationSettings(max_new_tokens=48)


def running_batch(settings: Settings, job_id: str, batches: list[int], pending: set[int]) -> tuple[int, str] | None:
    """A batch whose prompts are still pending and whose worker marks it running, with that worker's hostname."""
    client = connect_redis(settings.broker_url or "")
    try:
        for batch in batches:
            value = client.get(f"{settings.key_prefix}:running:llm:{job_id}:{batch}")
            if value and batch in pending:
                assert isinstance(value, bytes)  # connect_redis's client does not decode replies
                return batch, value.decode()
    finally:
        client.close()
    return None


@dataclass
class KilledMidBatch:
    """A job whose worker was SIGKILLed while it generated a batch, followed to its end."""

    handle: api.RunHandle
    status: dict[str, Any]
    victim_batch: int
    before: dict[str, tuple[float | None, str | None]]  # each row's (finished_at, output) at the kill


def kill_a_worker_mid_batch(
    settings: Settings, workers: Any, submitted: Any, found_within_s: float, finish_within_s: float
) -> KilledMidBatch:
    """SIGKILL the worker generating one of the job's batches, then follow the job to its end; the
    launcher has started a fresh worker in its place."""
    services = open_client_services(settings)
    handle = api.RunHandle(submitted.job_id, settings)
    indices = [batch.index for batch in submitted.batches]

    def pending_batches() -> set[int]:
        rows = prompt_rows(services.store, submitted.job_id)
        return {row.batch for row in rows if row.state == "pending" and row.batch is not None}

    try:
        with api.scheduling(handle) as scheduler:
            wait_until(
                lambda: running_batch(settings, handle.id, indices, pending_batches()) is not None, found_within_s
            )
            found = running_batch(settings, handle.id, indices, pending_batches())
            assert found is not None
            victim_batch, hostname = found
            victim = pid_of_worker(workers, hostname)
            before = {row.key: (row.finished_at, row.output) for row in prompt_rows(services.store, handle.id)}
            workers_before = {child.pid for child in worker_children(workers)}
            os.kill(victim, signal.SIGKILL)
            status = handle.wait(finish_within_s, tick=scheduler.tick)
    finally:
        services.close()
    assert victim not in {child.pid for child in worker_children(workers)}
    assert len(worker_children(workers)) == 2 and workers_before != {c.pid for c in worker_children(workers)}
    return KilledMidBatch(handle, status, victim_batch, before)


def assert_the_killed_batch_ran_again(store: Any, killed: KilledMidBatch) -> list[Any]:
    """The job finished; the killed batch ran again (attempt 2) and rows stored before the kill were not
    written again. Returns the job's rows."""
    assert killed.status["state"] == "finished"
    rows = prompt_rows(store, killed.handle.id)
    not_done = [(row.key, row.batch, row.state, row.error) for row in rows if row.state != "done"]
    assert not not_done, (
        len(not_done),
        not_done[:3],
        [(t.task, t.state, t.attempt) for t in store.task_timings(killed.handle.id)],
    )
    timing = next(t for t in store.task_timings(killed.handle.id) if t.task == batch_task_name(killed.victim_batch))
    assert timing.attempt == 2
    for row in rows:
        if killed.before[row.key][0] is not None:
            assert (row.finished_at, row.output) == killed.before[row.key]
    return rows


@pytest.mark.faults
def test_a_worker_killed_mid_batch_loses_nothing(settings: Settings, tmp_path: Path, slow_model_path: Path) -> None:
    settings = reliable_settings(settings)
    input_path = tmp_path / "prompts.jsonl"
    input_path.write_text("".join(json.dumps({"id": i, "prompt": f"Item {i}: " + "go " * i}) + "\n" for i in range(16)))
    services = open_client_services(settings)
    with launcher(settings, procs=2, cwd=tmp_path) as workers:
        request = JobRequest(input_path, str(slow_model_path), GENERATION, batch_size=4)
        killed = kill_a_worker_mid_batch(settings, workers, submit_job(services, request), 90, 240)
    rows = assert_the_killed_batch_ran_again(services.store, killed)
    assert {row.key: row.output for row in rows} == expected_outputs(slow_model_path, rows, GENERATION)
    services.close()
