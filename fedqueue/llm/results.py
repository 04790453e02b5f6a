"""The LLM job kind's rows in the store: one per prompt, written once each, and what is read back.

Every write to a generated row is conditional on it still being pending, so a batch delivered
twice, or a job submitted again, never writes a row twice. Rows that duplicate another prompt
(`same_as`) get its outcome in the same transaction.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from sqlalchemy import bindparam, func, select, update

from fedqueue.llm.schema import LlmPromptRow
from fedqueue.store import Store
from fedqueue.store.repo import TaskTiming, dialect_insert, retry_transient
from fedqueue.store.schema import TaskTimingRow

ERROR_MAX = 4000  # characters of an error kept per row


@dataclass(frozen=True)
class Outcome:
    """What a worker stores for one generated (or failed) prompt."""

    key: str
    state: str  # done | failed
    output: str | None = None
    prompt_tokens: int | None = None
    generated_tokens: int | None = None
    finish_reason: str | None = None
    error: str | None = None


@retry_transient
def insert_prompts(store: Store, rows: Sequence[dict[str, Any]]) -> None:
    """Add prompt rows in one transaction; a key already there is kept as it is (a job submitted again)."""
    if not rows:
        return
    insert = dialect_insert(store.engine.dialect)
    statement = insert(LlmPromptRow).on_conflict_do_nothing(index_elements=["run_id", "key"])
    # One statement for many rows needs every row to name the same columns.
    columns = sorted({column for row in rows for column in row})
    uniform = [{column: row.get(column) for column in columns} for row in rows]
    with store.engine.begin() as connection:
        for start in range(0, len(uniform), 1000):
            connection.execute(statement, uniform[start : start + 1000])


@retry_transient
def assign_batches(store: Store, run_id: str, batches: Iterable[tuple[int, Sequence[str]]]) -> None:
    """Record which batch each pending prompt is planned in."""
    with store.engine.begin() as connection:
        for batch, keys in batches:
            connection.execute(
                update(LlmPromptRow)
                .where(LlmPromptRow.run_id == run_id, LlmPromptRow.key.in_(keys), LlmPromptRow.state == "pending")
                .values(batch=batch)
            )


@retry_transient
def pending_prompts(store: Store, run_id: str, keys: Sequence[str] | None = None) -> list[LlmPromptRow]:
    """Prompts still to generate (those that copy another prompt's output left out), by key when given."""
    query = select(LlmPromptRow).where(
        LlmPromptRow.run_id == run_id, LlmPromptRow.state == "pending", LlmPromptRow.same_as.is_(None)
    )
    if keys is not None:
        query = query.where(LlmPromptRow.key.in_(keys))
    with store.session() as session:
        return list(session.scalars(query.order_by(LlmPromptRow.line)))


@retry_transient
def next_batch_index(store: Store, run_id: str) -> int:
    """The first batch number no plan of this job has used."""
    with store.engine.connect() as connection:
        last = connection.execute(select(func.max(LlmPromptRow.batch)).where(LlmPromptRow.run_id == run_id)).scalar()
    return 0 if last is None else int(last) + 1


@retry_transient
def record_outcomes(
    store: Store, run_id: str, batch: int, worker: str, outcomes: Sequence[Outcome], timing: TaskTiming | None
) -> int:
    """Store a batch's outcomes (rows still pending only) and its timing in one transaction.

    Returns how many prompts of the job are still pending afterwards: 0 means the job is complete.
    """
    now = time.time()
    latency_ms = None if timing is None else timing.compute_ms
    fields = [field for field in Outcome.__dataclass_fields__ if field != "key"]
    # Each statement once for the whole batch (executemany), not once per prompt; bound names apart from columns'.
    values: dict[str, Any] = {field: bindparam(f"b_{field}") for field in fields}
    values.update(batch=batch, worker=worker[:200], latency_ms=latency_ms, finished_at=now)
    params = [
        {
            "b_key": outcome.key,
            **{f"b_{field}": getattr(outcome, field) for field in fields},
            "b_error": None if outcome.error is None else outcome.error[-ERROR_MAX:],
        }
        for outcome in outcomes
    ]
    pending = (LlmPromptRow.run_id == run_id, LlmPromptRow.state == "pending")
    with store.engine.begin() as connection:
        if params:
            for column in (LlmPromptRow.key, LlmPromptRow.same_as):  # the prompt, then its copies
                connection.execute(
                    update(LlmPromptRow).where(*pending, column == bindparam("b_key")).values(**values), params
                )
        if timing is not None:
            connection.execute(store.timing_upsert, asdict(timing))
        left = connection.execute(
            select(func.count())
            .select_from(LlmPromptRow)
            .where(LlmPromptRow.run_id == run_id, LlmPromptRow.state == "pending")
        ).scalar()
    return int(left or 0)


@retry_transient
def settle_copies(store: Store, run_id: str) -> None:
    """Give pending copies of an already generated prompt its outcome (prompts added to a job again)."""
    with store.session() as session:
        waiting = session.scalars(
            select(LlmPromptRow).where(
                LlmPromptRow.run_id == run_id, LlmPromptRow.state == "pending", LlmPromptRow.same_as.is_not(None)
            )
        ).all()
        sources = {row.same_as for row in waiting}
        if not sources:
            return
        settled = session.scalars(
            select(LlmPromptRow).where(
                LlmPromptRow.run_id == run_id, LlmPromptRow.key.in_(sources), LlmPromptRow.state != "pending"
            )
        ).all()
    for source in settled:
        outcome = Outcome(
            key=source.key,
            state=source.state,
            output=source.output,
            prompt_tokens=source.prompt_tokens,
            generated_tokens=source.generated_tokens,
            finish_reason=source.finish_reason,
            error=source.error,
        )
        record_outcomes(store, run_id, source.batch or 0, source.worker or "", [outcome], None)


@retry_transient
def prompt_rows(store: Store, run_id: str) -> list[LlmPromptRow]:
    """Every row of a job in input order (error rows of malformed lines included)."""
    with store.session() as session:
        query = select(LlmPromptRow).where(LlmPromptRow.run_id == run_id).order_by(LlmPromptRow.line)
        return list(session.scalars(query))


@retry_transient
def job_counts(store: Store, run_id: str) -> dict[str, int]:
    """Prompts by state, and tokens read and generated so far."""
    columns = (
        LlmPromptRow.state,
        func.count(),
        func.coalesce(func.sum(LlmPromptRow.prompt_tokens), 0),
        func.coalesce(func.sum(LlmPromptRow.generated_tokens), 0),
    )
    query = select(*columns).where(LlmPromptRow.run_id == run_id).group_by(LlmPromptRow.state)
    counts: dict[str, int] = defaultdict(int)
    with store.engine.connect() as connection:
        for state, count, prompt_tokens, generated_tokens in connection.execute(query):
            counts[state] += int(count)
            counts["prompt_tokens"] += int(prompt_tokens or 0)
            counts["generated_tokens"] += int(generated_tokens or 0)
    counts["total"] = counts["pending"] + counts["done"] + counts["failed"]
    return dict(counts)


@retry_transient
def done_counts(store: Store, run_ids: Sequence[str]) -> dict[str, tuple[int, int]]:
    """(prompts generated, prompts in all) of each job, in one query: `fedqueue runs` lists many."""
    query = (
        select(LlmPromptRow.run_id, LlmPromptRow.state, func.count())
        .where(LlmPromptRow.run_id.in_(run_ids))
        .group_by(LlmPromptRow.run_id, LlmPromptRow.state)
    )
    counts = {run_id: (0, 0) for run_id in run_ids}
    with store.engine.connect() as connection:
        for run_id, state, count in connection.execute(query):
            done, total = counts[run_id]
            counts[run_id] = (done + (int(count) if state == "done" else 0), total + int(count))
    return counts


@retry_transient
def batch_timings(store: Store, run_id: str) -> list[TaskTimingRow]:
    """The job's generation tasks as the shared timing table holds them."""
    return [row for row in store.task_timings(run_id) if row.task_type == "generate"]
