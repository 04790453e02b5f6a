"""LLM batch jobs through real Redis and real worker processes, checked against a plain generation loop."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest

from fedqueue.config import Settings
from fedqueue.core.services import Services
from fedqueue.fl.scheduler import submit_run
from fedqueue.fl.strategy.common import final_state
from fedqueue.llm.generate import PromptIn, generate_batch
from fedqueue.llm.job import JobRequest, Submitted, submit_job
from fedqueue.llm.messages import GenerateBatch
from fedqueue.llm.model import load_model
from fedqueue.llm.results import prompt_rows
from fedqueue.llm.settings import GenerationSettings
from fedqueue.llm.slots import answering_slots
from fedqueue.queue.client import open_client_services
from fedqueue.report import write_report
from tests.conftest import running_workers
from tests.support.helpers import assert_same_weights, reference_final_state, small_config, wait_finished
from tests.support.reliability_support import wait_until

GENERATION = GenerationSettings(max_new_tokens=12)
LONG_PROMPT = "x" * 400  # over the tiny model's 256-token context


def write_input(path: Path, count: int) -> Path:
    """`count` prompts of varied length, two chats, a repeated prompt, a malformed line and an over-long prompt."""
    lines = [json.dumps({"id": f"p{i}", "prompt": f"Question {i}: " + "why " * (i % 9)}) for i in range(count - 2)]
    lines += [
        json.dumps({"id": "chat-1", "messages": [{"role": "user", "content": "Hello there"}]}),
        json.dumps({"messages": [{"role": "system", "content": "Be brief"}, {"role": "user", "content": "Hi"}]}),
        json.dumps({"id": "again", "prompt": "Question 1: why "}),  # the same text as p1
        "{this line is not JSON",
        json.dumps({"id": "long", "prompt": LONG_PROMPT}),
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


def expected_outputs(
    model_path: Path, rows: list[Any], generation: GenerationSettings = GENERATION
) -> dict[str, str | None]:
    """What a for-loop over the prompts, one at a time in this process, generates."""
    loaded = load_model(str(model_path))
    outputs: dict[str, str | None] = {}
    for row in rows:
        messages = None if row.messages is None else tuple((role, text) for role, text in row.messages)
        [result], _ = generate_batch(loaded, [PromptIn(row.key, row.prompt, messages)], generation)
        outputs[row.key] = result.output
    return outputs


def submit(services: Services, input_path: Path, model: Path, **options: Any) -> Submitted:
    request = JobRequest(input_path=input_path, model=str(model), generation=GENERATION, **options)
    return submit_job(services, request)


def test_a_job_on_two_workers_equals_the_one_at_a_time_loop(
    settings: Settings, tmp_path: Path, tiny_model_path: Path
) -> None:
    input_path = write_input(tmp_path / "prompts.jsonl", 40)
    services = open_client_services(settings)
    submitted = submit(services, input_path, tiny_model_path, batch_size=8)
    # The malformed line, and the over-long prompt: the model's tokenizer counted it at submit.
    assert (submitted.prompts, [e.line for e in submitted.input_errors]) == (41, [42, 43])
    assert submitted.enqueued == 40  # the repeated prompt is stored from its first copy, not generated
    with running_workers(settings, procs=2, log_dir=tmp_path / "logs"):
        wait_finished(services.store, submitted.job_id, 120)
    rows = prompt_rows(services.store, submitted.job_id)
    assert [row.line for row in rows] == list(range(1, 44))  # every input line, in input order
    by_id = {row.input_id: row for row in rows}
    assert by_id["long"].state == "failed" and "exceeds the model's context" in (by_id["long"].error or "")
    malformed = next(row for row in rows if row.line == 42)
    assert malformed.state == "failed" and "not valid JSON" in (malformed.error or "")
    generated = [row for row in rows if row.state == "done"]
    assert len(generated) == 41
    expected = expected_outputs(tiny_model_path, generated)
    assert {row.key: row.output for row in generated} == expected
    assert by_id["again"].output == by_id["p1"].output and by_id["again"].same_as == "id:p1"
    # Both workers generated, and every batch has its row in the shared timing table.
    timings = services.store.task_timings(submitted.job_id)
    assert {t.task_type for t in timings} == {"generate"} and len(timings) == len(submitted.batches)
    assert len({t.worker for t in timings}) == 2
    assert all(t.enqueued_at <= t.started_at <= t.finished_at and t.compute_ms > 0 for t in timings)
    # The report draws the batches like device tasks and adds the job's own numbers.
    report = write_report(services.store, submitted.job_id, tmp_path / "report")
    assert (
        report["tasks_by_type"] == {"generate": {"done": len(submitted.batches), "failed": 0}} and report["slots"] == 2
    )
    job = report["job"]
    assert job["done"] == 41 and 0 <= job["pad_fraction"] < 0.5
    assert len(job["workers"]) == 2 and all(worker["tokens_per_s"] > 0 for worker in job["workers"])
    html = (tmp_path / "report" / "report.html").read_text()
    assert "<h2>Job</h2>" in html and "<h2>Rounds</h2>" not in html
    services.close()


@pytest.mark.slow
def test_submitting_again_generates_only_what_is_missing(
    settings: Settings, tmp_path: Path, tiny_model_path: Path
) -> None:
    """Half the batches are lost from the queue; submitting the same input again generates just their prompts."""
    input_path = write_input(tmp_path / "prompts.jsonl", 23)  # 23 prompts to generate
    services = open_client_services(settings)
    first = submit(services, input_path, tiny_model_path, batch_size=4, slots=2)
    assert len(first.batches) >= 6 and len(first.batches) % 2 == 0
    lost = drop_queued(settings, len(first.batches) // 2)
    with running_workers(settings, procs=1, log_dir=tmp_path / "logs-1"):
        wait_until(lambda: pending_keys(services, first.job_id) == lost, 60)
    before = {row.key: (row.finished_at, row.output) for row in prompt_rows(services.store, first.job_id)}
    assert services.store.get_run(first.job_id).state == "running"

    again = submit(services, input_path, tiny_model_path, batch_size=4, slots=2)
    assert again.job_id == first.job_id and again.resumed and again.prompts == first.prompts
    assert again.enqueued == len(lost) and {key for batch in again.batches for key in batch.keys} == lost
    assert min(batch.index for batch in again.batches) > max(batch.index for batch in first.batches)
    with running_workers(settings, procs=2, log_dir=tmp_path / "logs-2"):
        wait_finished(services.store, first.job_id, 120)
    rows = prompt_rows(services.store, first.job_id)
    assert all(row.state != "pending" for row in rows)
    for row in rows:  # rows stored before the second submit were not written again
        if row.key not in lost and before[row.key][0] is not None:
            assert (row.finished_at, row.output) == before[row.key]
    generated = [row for row in rows if row.state == "done"]
    assert {row.key: row.output for row in generated} == expected_outputs(tiny_model_path, generated)
    services.close()


def test_a_job_planned_for_the_two_slots_that_answer_keeps_one_row_per_prompt_in_order(
    settings: Settings, tmp_path: Path, tiny_model_path: Path
) -> None:
    """The submitter learns the workers' slots, plans equal batches for them, and every line gets its one row."""
    input_path = tmp_path / "prompts.jsonl"
    texts = [f"Q{i}: " + "why " * (i * 7 % 23) for i in range(48)]  # 4 to 96 characters, in no order
    input_path.write_text("".join(json.dumps({"id": f"q{i}", "prompt": text}) + "\n" for i, text in enumerate(texts)))
    services = open_client_services(settings)
    with running_workers(settings, procs=2, log_dir=tmp_path / "logs"):
        slots = answering_slots(settings)
        assert slots == 2
        submitted = submit(services, input_path, tiny_model_path, batch_size=32, slots=slots)
        wait_finished(services.store, submitted.job_id, 120)
    # 48 prompts under the cap of 32 once were two unequal batches; now an even count of equal shares.
    assert submitted.slots == 2 and len(submitted.batches) >= 2 and len(submitted.batches) % 2 == 0
    shares = [sum(batch.tokens) + GENERATION.max_new_tokens * len(batch.keys) for batch in submitted.batches]
    longest = max(max(batch.tokens) for batch in submitted.batches) + GENERATION.max_new_tokens
    assert max(shares) - min(shares) <= 2 * longest
    rows = prompt_rows(services.store, submitted.job_id)
    assert [row.input_id for row in rows] == [f"q{i}" for i in range(48)]  # one row per line, in input order
    assert [row.line for row in rows] == list(range(1, 49)) and all(row.state == "done" for row in rows)
    assert {row.key: row.output for row in rows} == expected_outputs(tiny_model_path, rows)
    assert len({t.worker for t in services.store.task_timings(submitted.job_id)}) == 2
    services.close()


def drop_queued(settings: Settings, count: int) -> set[str]:
    """Take `count` batch messages off the LLM queue, as a broker that lost them; their prompt keys."""
    from fedqueue.core.services import connect_redis
    from fedqueue.llm.messages import LLM_QUEUE

    client = connect_redis(settings.broker_url or "")
    keys: set[str] = set()
    try:
        for _ in range(count):
            raw = client.rpop(f"{settings.key_prefix}:{settings.queue(LLM_QUEUE)}")
            assert isinstance(raw, bytes)  # a message was there, and the client does not decode replies
            message = json.loads(raw)
            body = json.loads(base64.b64decode(message["body"]))
            keys.update(body[0][0]["keys"])
    finally:
        client.close()
    return keys


def pending_keys(services: Services, job_id: str) -> set[str]:
    return {row.key for row in prompt_rows(services.store, job_id) if row.state == "pending" and row.same_as is None}


@pytest.mark.faults
def test_a_batch_delivered_twice_is_stored_once(settings: Settings, tmp_path: Path, tiny_model_path: Path) -> None:
    input_path = write_input(tmp_path / "prompts.jsonl", 10)
    services = open_client_services(settings)
    publish = services.enqueue
    services.enqueue = lambda tasks: publish(list(tasks) + list(tasks))  # every batch sent twice
    submitted = submit(services, input_path, tiny_model_path, batch_size=16, slots=1)
    keys = [GenerateBatch(submitted.job_id, b.index, b.keys, 0.0).attempt_key for b in submitted.batches]
    with running_workers(settings, procs=2, log_dir=tmp_path / "logs"):
        wait_finished(services.store, submitted.job_id, 120)
        stored = {row.key: (row.finished_at, row.worker) for row in prompt_rows(services.store, submitted.job_id)}
        # Every second delivery reaches a worker too (the attempt counter sees both), and finds nothing pending.
        wait_until(lambda: all(services.ledger.attempts(key) == 2 for key in keys), 60)
        wait_until(lambda: not any(services.ledger.running_of(keys).values()), 60)
    after = {row.key: (row.finished_at, row.worker) for row in prompt_rows(services.store, submitted.job_id)}
    assert after == stored
    assert len(services.store.task_timings(submitted.job_id)) == len(submitted.batches)
    services.close()


def test_fl_rounds_and_an_llm_job_share_the_same_workers(
    settings: Settings, tmp_path: Path, tiny_model_path: Path
) -> None:
    procs = 2
    config = small_config(rounds=2)
    input_path = write_input(tmp_path / "prompts.jsonl", 16)
    services = open_client_services(settings)
    with running_workers(settings, procs=procs, log_dir=tmp_path / "logs"):
        run_id = submit_run(services, config)
        job = submit(services, input_path, tiny_model_path, batch_size=4)
        wait_finished(services.store, run_id, 120)
        wait_finished(services.store, job.job_id, 120)
    fl_workers = {t.worker for t in services.store.task_timings(run_id)}
    llm_workers = {t.worker for t in services.store.task_timings(job.job_id)}
    assert len(fl_workers | llm_workers) == procs and fl_workers & llm_workers
    # FL's weights are untouched by generation running beside it in the same processes.
    assert_same_weights(final_state(services.store, run_id), reference_final_state(config))
    rows = [row for row in prompt_rows(services.store, job.job_id) if row.state == "done"]
    assert {row.key: row.output for row in rows} == expected_outputs(tiny_model_path, rows)
    services.close()


def test_a_model_that_cannot_load_fails_its_prompts_in_one_line(settings: Settings, tmp_path: Path) -> None:
    """Every attempt fails on the worker: the batch's prompts are stored failed and the job still ends."""
    broken = tmp_path / "broken-model"
    broken.mkdir()
    (broken / "config.json").write_text("{}")
    input_path = write_input(tmp_path / "prompts.jsonl", 6)
    services = open_client_services(settings)
    submitted = submit(services, input_path, broken, batch_size=16)
    with running_workers(settings, procs=1, log_dir=tmp_path / "logs"):
        wait_finished(services.store, submitted.job_id, 120)
    assert services.store.get_run(submitted.job_id).state == "finished"
    rows = [row for row in prompt_rows(services.store, submitted.job_id) if row.key.startswith(("id:", "line:"))]
    assert rows and all(row.state == "failed" for row in rows)
    generated = [row for row in rows if row.same_as is None and "exceeds" not in (row.error or "")]
    for row in generated:  # the traceback's last line, not the traceback
        assert "cannot be loaded" in (row.error or "") and "\n" not in (row.error or ""), row.error
    timings = services.store.task_timings(submitted.job_id)
    assert len(timings) == len(submitted.batches)
    for timing in timings:
        assert (timing.state, timing.attempt) == ("failed", settings.max_attempts)
        assert "Traceback" in (timing.error or "")
    services.close()
