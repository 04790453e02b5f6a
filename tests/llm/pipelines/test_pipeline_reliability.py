"""A pipeline survives a worker SIGKILLed in the middle of its batch of calls: real launcher, workers and Redis."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from fedqueue import api
from fedqueue.config import Settings
from fedqueue.core.broker import keys
from fedqueue.core.services import connect_redis
from fedqueue.llm.model import load_model
from fedqueue.llm.pipelines.alone import run_alone
from fedqueue.llm.pipelines.messages import PipelineLane
from fedqueue.llm.pipelines.program import load_program
from fedqueue.llm.pipelines.rows import call_rows, item_rows, lanes
from fedqueue.llm.pipelines.submit import PipelineRequest, submit_pipeline
from fedqueue.llm.settings import GenerationSettings
from fedqueue.queue.client import open_client_services
from tests.support.reliability_support import launcher, pid_of_worker, reliable_settings, wait_until, worker_children

GENERATION = GenerationSettings(max_new_tokens=40)


def lane_running_with_calls(settings: Settings, run_id: str) -> tuple[PipelineLane, str] | None:
    """A lane task that runs on a worker and holds claimed calls (it is generating them), and that worker."""
    services = open_client_services(settings)
    client = connect_redis(settings.broker_url or "")
    try:
        held = {call.lane for call in call_rows(services.store, run_id) if call.state == "claimed"}
        for lane, seq in lanes(services.store, run_id):
            task = PipelineLane(run_id, lane, seq, 0.0)
            worker = client.get(keys.running(settings.key_prefix, task.attempt_key))
            if worker and lane in held:
                assert isinstance(worker, bytes)
                return task, worker.decode()
    finally:
        client.close()
        services.close()
    return None


@pytest.mark.faults
def test_a_worker_killed_mid_pipeline_redoes_nothing_stored(
    settings: Settings, tmp_path: Path, slow_model_path: Path
) -> None:
    settings = reliable_settings(settings)
    settings.activate_plugin_path()
    items = [{"id": f"t{n}", "topic": "word " * (n % 5)} for n in range(12)]
    input_path = tmp_path / "items.jsonl"
    input_path.write_text("".join(json.dumps(item) + "\n" for item in items))
    services = open_client_services(settings)
    with launcher(settings, procs=2, cwd=tmp_path) as workers:
        request = PipelineRequest(input_path, "fq_pipelines:refine", str(slow_model_path), GENERATION, batch_size=4)
        submitted = submit_pipeline(services, request)
        handle = api.RunHandle(submitted.job_id, settings)
        with api.scheduling(handle) as scheduler:
            wait_until(lambda: lane_running_with_calls(settings, handle.id) is not None, 120)
            found = lane_running_with_calls(settings, handle.id)
            assert found is not None
            victim_task, hostname = found
            victim = pid_of_worker(workers, hostname)
            held = {(c.item_key, c.step) for c in call_rows(services.store, handle.id) if c.lane == victim_task.lane}
            before = {(c.item_key, c.step): (c.finished_at, c.output) for c in call_rows(services.store, handle.id)}
            os.kill(victim, signal.SIGKILL)
            status = handle.wait(300, tick=scheduler.tick)
        assert victim not in {child.pid for child in worker_children(workers)}
    assert status["state"] == "finished"
    assert [item.state for item in item_rows(services.store, handle.id)] == ["done"] * 12
    calls = call_rows(services.store, handle.id)
    for call in calls:  # a step stored before the kill was not written again
        stored_before = before.get((call.item_key, call.step), (None, None))
        if stored_before[0] is not None:
            assert (call.finished_at, call.output) == stored_before
    # The killed task ran again (a second attempt) and stored the calls it held.
    assert services.ledger.attempts(victim_task.attempt_key) == 2
    killed = [c for c in calls if (c.item_key, c.step) in held and before[(c.item_key, c.step)][0] is None]
    assert killed and all(call.state == "done" for call in killed)
    loaded = load_model(str(slow_model_path))
    program = load_program("fq_pipelines:refine")
    traces: dict[str, list[tuple[object, str | None]]] = {}
    for call in calls:
        traces.setdefault(call.item_key, []).append((call.request, call.output))
    for item in items:
        key = f"id:{item['id']}"
        assert traces[key] == run_alone(loaded, program, item, GENERATION, key).steps, key
    services.close()
