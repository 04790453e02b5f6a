"""Pipelines through real Redis and real worker processes, checked against each item's program run alone."""

from __future__ import annotations

import json
from pathlib import Path

from fedqueue.config import Settings
from fedqueue.llm.model import load_model
from fedqueue.llm.pipelines.alone import run_alone
from fedqueue.llm.pipelines.program import load_program
from fedqueue.llm.pipelines.rows import call_rows, item_rows
from fedqueue.llm.pipelines.submission import PipelineSubmission
from fedqueue.llm.pipelines.submit import PipelineRequest, submit_pipeline
from fedqueue.llm.settings import GenerationSettings
from fedqueue.queue.client import open_client_services
from fedqueue.report.run_data import read_spans
from tests.conftest import running_workers
from tests.support.helpers import wait_finished
from tests.support.reliability_support import PLUGINS

GENERATION = GenerationSettings(max_new_tokens=12)
TOPICS = ["cats", "a long river", "x", "tea", "the sea at night", "numbers", "why", "red", "ok", "stars"]


def write_items(path: Path, count: int) -> Path:
    path.write_text(
        "".join(json.dumps({"id": f"t{n}", "topic": TOPICS[n % 10] * (1 + n % 3)}) + "\n" for n in range(count))
    )
    return path


def with_programs(settings: Settings) -> Settings:
    return settings.with_plugin_path([str(PLUGINS)])


def expected_traces(
    model: Path, items: list[dict[str, object]]
) -> dict[str, list[tuple[dict[str, object], str | None]]]:
    loaded = load_model(str(model))
    program = load_program("fq_pipelines:refine")
    return {
        f"id:{item['id']}": run_alone(loaded, program, item, GENERATION, f"id:{item['id']}").steps for item in items
    }


def test_a_three_step_pipeline_on_two_workers_equals_each_item_run_alone(
    settings: Settings, tmp_path: Path, tiny_model_path: Path
) -> None:
    settings = with_programs(settings)
    settings.activate_plugin_path()
    input_path = write_items(tmp_path / "items.jsonl", 20)
    services = open_client_services(settings)
    request = PipelineRequest(
        input_path, "fq_pipelines:refine", str(tiny_model_path), GENERATION, batch_size=4, lanes=2
    )
    submitted = submit_pipeline(services, request)
    assert (submitted.items, submitted.running, submitted.lanes) == (20, 20, 2)
    with running_workers(settings, procs=2, log_dir=tmp_path / "logs"):
        wait_finished(services.store, submitted.job_id, 180)
    items = item_rows(services.store, submitted.job_id)
    assert [item.state for item in items] == ["done"] * 20, [item.error for item in items]
    calls = call_rows(services.store, submitted.job_id)
    traces: dict[str, list[tuple[dict[str, object], str | None]]] = {}
    for call in calls:
        traces.setdefault(call.item_key, []).append((call.request, call.output))
    inputs = [json.loads(line) for line in input_path.read_text().splitlines()]
    assert traces == expected_traces(tiny_model_path, inputs)
    assert {len(steps) for steps in traces.values()} == {2, 3}  # items took unequal numbers of steps
    for item in items:  # the result is what the program returned from its outputs
        steps = traces[item.key]
        assert item.result["draft"] == steps[0][1] and item.result["check"] == steps[1][1]
        assert item.steps == len(steps)
    assert all(call.state == "done" and call.generated_tokens for call in calls)
    assert len({call.worker for call in calls}) == 2  # both workers took calls
    # Every lane task that stored a batch left its row of the timing table: the report's timeline reads them.
    timings = services.store.task_timings(submitted.job_id)
    assert timings and all(row.task_type == "generate" and row.state == "done" for row in timings)
    assert all(row.task.startswith(("lane 0 task ", "lane 1 task ")) for row in timings)
    assert all(row.started_at <= row.finished_at and row.compute_ms > 0 for row in timings)
    assert {row.worker for row in timings} == {call.worker for call in calls}
    assert len(timings) >= -(-len(calls) // 4)  # at least as many batches as calls in batches of 4
    assert len(read_spans(services.store, submitted.job_id)) == len(timings)
    services.close()


def test_a_pipeline_on_a_configured_broker_opens_a_lane_per_llm_slot_that_answers(
    settings: Settings, tmp_path: Path, tiny_model_path: Path
) -> None:
    """The slots are asked as a batch job asks them (LLM workers only, answers collected as they come), not with
    the FL submit's question, which waits a whole second after the last answer."""
    settings = with_programs(settings)
    settings.activate_plugin_path()
    request = PipelineRequest(write_items(tmp_path / "items.jsonl", 4), "fq_pipelines:refine", str(tiny_model_path))
    services = open_client_services(settings)

    def not_this_question() -> dict[str, int]:
        raise AssertionError("the FL submit's question was asked")

    services.worker_slots = not_this_question
    with running_workers(settings, procs=2, slots=2, log_dir=tmp_path / "logs"):
        submission = PipelineSubmission(request)
        submission.check_before_start(settings)
        assert submission.answering is not None
        job_id = submission.submit(services)
        assert submission.submitted is not None and submission.submitted.lanes == 4
        wait_finished(services.store, job_id, 180)
    assert [item.state for item in item_rows(services.store, job_id)] == ["done"] * 4
    services.close()
