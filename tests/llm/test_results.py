"""The LLM job's rows in a real store (SQLite and Postgres): each written once, copies settled with their source."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from fedqueue.llm.results import (
    Outcome,
    assign_batches,
    insert_prompts,
    job_counts,
    next_batch_index,
    pending_prompts,
    prompt_rows,
    record_outcomes,
    settle_copies,
)
from fedqueue.store import Store
from fedqueue.store.repo import TaskTiming


@pytest.fixture
def job(store: Store) -> str:
    """A job of its own per test: the Postgres database is shared by the whole session."""
    job_id = f"llm-{uuid.uuid4().hex[:8]}"
    store.create_run(job_id, "prompts.jsonl", {"model": "m"}, 0, kind="llm")
    return job_id


def row(job: str, key: str, line: int, prompt: str, same_as: str | None = None) -> dict[str, Any]:
    return {
        "run_id": job,
        "key": key,
        "line": line,
        "prompt_sha256": "x",
        "prompt": prompt,
        "same_as": same_as,
        "state": "pending",
    }


def timing(job: str, batch: int) -> TaskTiming:
    return TaskTiming(
        run_id=job,
        kind="llm",
        task_type="generate",
        task=f"batch {batch}",
        round_index=None,
        state="done",
        worker="w1",
        device_used="cpu",
        attempt=1,
        enqueued_at=0.0,
        started_at=1.0,
        compute_ms=5.0,
    )


def test_rows_are_inserted_once_and_read_in_input_order(store: Store, job: str) -> None:
    rows = [
        row(job, "line:2", 2, "b"),
        row(job, "line:1", 1, "a"),
        {**row(job, "error:line:3", 3, ""), "prompt": None, "state": "failed"},
    ]
    insert_prompts(store, rows)
    insert_prompts(store, [{**row(job, "line:1", 1, "changed")}])  # submitted again: the row there stays
    assert [(r.key, r.prompt) for r in prompt_rows(store, job)] == [
        ("line:1", "a"),
        ("line:2", "b"),
        ("error:line:3", None),
    ]
    assert job_counts(store, job) == {
        "done": 0,
        "pending": 2,
        "failed": 1,
        "prompt_tokens": 0,
        "generated_tokens": 0,
        "total": 3,
    }


def test_an_outcome_is_written_once_and_copies_get_it_too(store: Store, job: str) -> None:
    insert_prompts(store, [row(job, "a", 1, "p"), row(job, "b", 2, "q"), row(job, "a2", 3, "p", same_as="a")])
    assign_batches(store, job, [(0, ["a", "b"])])
    assert next_batch_index(store, job) == 1
    assert [r.key for r in pending_prompts(store, job)] == ["a", "b"]  # the copy is not generated
    first = [Outcome("a", "done", "out-a", 3, 4, "length"), Outcome("b", "failed", error="boom")]
    assert record_outcomes(store, job, 0, "w1", first, timing(job, 0)) == 0
    # A second delivery of the same batch finds nothing pending and changes nothing.
    again = [Outcome("a", "done", "other", 9, 9, "stop")]
    assert record_outcomes(store, job, 0, "w2", again, timing(job, 0)) == 0
    rows = {r.key: r for r in prompt_rows(store, job)}
    assert (rows["a"].output, rows["a"].worker, rows["a"].generated_tokens) == ("out-a", "w1", 4)
    assert (rows["a2"].output, rows["a2"].state) == ("out-a", "done")
    assert (rows["b"].state, rows["b"].error) == ("failed", "boom")
    assert len(store.task_timings(job)) == 1
    assert job_counts(store, job)["generated_tokens"] == 8  # the copy counts its own row


def test_a_copy_added_later_is_settled_from_its_stored_source(store: Store, job: str) -> None:
    insert_prompts(store, [row(job, "a", 1, "p")])
    record_outcomes(store, job, 0, "w1", [Outcome("a", "done", "out", 1, 2, "stop")], None)
    insert_prompts(store, [row(job, "later", 2, "p", same_as="a")])
    settle_copies(store, job)
    rows = {r.key: r for r in prompt_rows(store, job)}
    assert (rows["later"].state, rows["later"].output) == ("done", "out")
    assert job_counts(store, job).get("pending", 0) == 0
