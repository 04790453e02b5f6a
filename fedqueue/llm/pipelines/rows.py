"""A pipeline's rows in the store: items, calls (one per item and step) and lanes, and the one transaction that
stores a batch of outputs with what follows from them.

A call is pending until a lane claims it; the lane's task then stores it done (or failed) together with its
item's next call or end, and moves the lane on. That move is conditional on the lane still being at the task's
number, so a task delivered twice, or run again after its worker died, stores nothing twice.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from sqlalchemy import bindparam, exists, func, or_, select, update

from fedqueue.llm.pipelines.replay import Advance, Failed, Finished, NextCall
from fedqueue.llm.schema import PipelineCallRow, PipelineItemRow, PipelineLaneRow
from fedqueue.store import Store
from fedqueue.store.repo import TaskTiming, changed_one, dialect_insert, retry_transient

ERROR_MAX = 8000  # characters of a traceback kept per item


@dataclass(frozen=True)
class CallOutcome:
    """What generating one call gave."""

    item_key: str
    step: int
    output: str | None
    prompt_tokens: int | None = None
    generated_tokens: int | None = None
    finish_reason: str | None = None
    error: str | None = None


def call_row(run_id: str, item_key: str, call: NextCall, length: int) -> dict[str, Any]:
    return {
        "run_id": run_id,
        "item_key": item_key,
        "step": call.step,
        "request": call.request.to_dict(),
        "length": length,
        "settings": call.request.settings_key,
        "state": "pending",
    }


@retry_transient
def insert_items(store: Store, items: Sequence[Mapping[str, Any]], calls: Sequence[Mapping[str, Any]]) -> None:
    """Add items and their first calls in one transaction; rows already there are kept (a pipeline resubmitted)."""
    insert = dialect_insert(store.engine.dialect)
    with store.engine.begin() as connection:
        for table, rows, keys in (
            (PipelineItemRow, items, ["run_id", "key"]),
            (PipelineCallRow, calls, ["run_id", "item_key", "step"]),
        ):
            for start in range(0, len(rows), 1000):
                chunk = list(rows[start : start + 1000])
                if chunk:
                    connection.execute(insert(table).on_conflict_do_nothing(index_elements=keys), chunk)


@retry_transient
def open_lanes(store: Store, run_id: str, count: int) -> list[tuple[int, int]]:
    """Lanes 0..count-1 (those there already kept); every lane of the run as (lane, seq)."""
    insert = dialect_insert(store.engine.dialect)
    with store.engine.begin() as connection:
        connection.execute(
            insert(PipelineLaneRow).on_conflict_do_nothing(index_elements=["run_id", "lane"]),
            [{"run_id": run_id, "lane": lane, "seq": 0} for lane in range(count)],
        )
    return lanes(store, run_id)


@retry_transient
def lanes(store: Store, run_id: str) -> list[tuple[int, int]]:
    query = select(PipelineLaneRow.lane, PipelineLaneRow.seq).where(PipelineLaneRow.run_id == run_id)
    with store.engine.connect() as connection:
        return sorted((int(lane), int(seq)) for lane, seq in connection.execute(query))


@retry_transient
def lane_seq(store: Store, run_id: str, lane: int) -> int | None:
    query = select(PipelineLaneRow.seq).where(PipelineLaneRow.run_id == run_id, PipelineLaneRow.lane == lane)
    with store.engine.connect() as connection:
        found = connection.execute(query).scalar()
    return None if found is None else int(found)


@retry_transient
def claim(store: Store, run_id: str, lane: int, most: int, lanes_count: int) -> list[PipelineCallRow]:
    """The calls this lane holds: those it claimed before and has not stored (its task run again), else up to
    `most` pending calls of the decoding settings most calls wait for, and no more than an equal share of those
    among the lanes, so every lane has work while there is any. Calls of items furthest along go first (an
    item's later steps are not left for the end), then the longest (similar lengths batch with little padding)."""
    held = select(PipelineCallRow).where(
        PipelineCallRow.run_id == run_id, PipelineCallRow.lane == lane, PipelineCallRow.state == "claimed"
    )
    with store.session() as session:
        found = list(session.scalars(held.order_by(PipelineCallRow.length.desc(), PipelineCallRow.id)))
    if found:
        return found
    pending = (PipelineCallRow.run_id == run_id, PipelineCallRow.state == "pending")
    with store.engine.begin() as connection:
        largest = connection.execute(
            select(PipelineCallRow.settings, func.count().label("calls"))
            .where(*pending)
            .group_by(PipelineCallRow.settings)
            .order_by(func.count().desc(), PipelineCallRow.settings)
            .limit(1)
        ).first()
        if largest is None:
            return []
        share = min(most, -(-int(largest.calls) // max(1, lanes_count)))
        chosen = (
            select(PipelineCallRow.id)
            .where(*pending, PipelineCallRow.settings == largest.settings)
            .order_by(PipelineCallRow.step.desc(), PipelineCallRow.length.desc(), PipelineCallRow.id)
            .limit(share)
            .with_for_update(skip_locked=True)  # Postgres: two lanes never wait on each other's rows
        )
        ids = list(connection.execute(chosen).scalars())
        connection.execute(
            update(PipelineCallRow)
            .where(PipelineCallRow.id.in_(ids), PipelineCallRow.state == "pending")
            .values(state="claimed", lane=lane)
        )
    with store.session() as session:
        return list(session.scalars(held.order_by(PipelineCallRow.length.desc(), PipelineCallRow.id)))


@retry_transient
def item_states(
    store: Store, run_id: str, keys: Iterable[str]
) -> dict[str, tuple[PipelineItemRow, list[PipelineCallRow]]]:
    """Each item with its calls stored done, in step order: what replaying it needs."""
    wanted = sorted(set(keys))
    with store.session() as session:
        items = session.scalars(
            select(PipelineItemRow).where(PipelineItemRow.run_id == run_id, PipelineItemRow.key.in_(wanted))
        ).all()
        calls = session.scalars(
            select(PipelineCallRow)
            .where(
                PipelineCallRow.run_id == run_id,
                PipelineCallRow.item_key.in_(wanted),
                PipelineCallRow.state == "done",
            )
            .order_by(PipelineCallRow.step)
        ).all()
    done: dict[str, list[PipelineCallRow]] = defaultdict(list)
    for call in calls:
        done[call.item_key].append(call)
    return {item.key: (item, done[item.key]) for item in items}


@retry_transient
def store_batch(
    store: Store,
    run_id: str,
    lane: int,
    seq: int,
    worker: str,
    outcomes: Sequence[CallOutcome],
    advances: Mapping[str, tuple[Advance, int]],
    timing: TaskTiming | None = None,
) -> bool:
    """In one transaction: move the lane from `seq` on, store the calls' outcomes, each item's next call
    (with its length) or end, and the task's timing row. False, and nothing written, when the lane had moved on
    already."""
    now = time.time()
    insert = dialect_insert(store.engine.dialect)
    with store.engine.begin() as connection:
        moved = connection.execute(
            update(PipelineLaneRow)
            .where(PipelineLaneRow.run_id == run_id, PipelineLaneRow.lane == lane, PipelineLaneRow.seq == seq)
            .values(seq=seq + 1)
        )
        if not changed_one(moved):
            return False
        # Each kind of statement once for the whole batch (executemany), not once per call.
        if outcomes:
            connection.execute(
                update(PipelineCallRow)
                .where(
                    PipelineCallRow.run_id == run_id,
                    PipelineCallRow.item_key == bindparam("b_item_key"),
                    PipelineCallRow.step == bindparam("b_step"),
                    or_(PipelineCallRow.state == "pending", PipelineCallRow.state == "claimed"),  # no IN: executemany
                )
                .values(
                    state=bindparam("b_state"),
                    output=bindparam("b_output"),
                    prompt_tokens=bindparam("b_prompt_tokens"),
                    generated_tokens=bindparam("b_generated_tokens"),
                    finish_reason=bindparam("b_finish_reason"),
                    error=bindparam("b_error"),
                    worker=worker[:200],
                    finished_at=now,
                ),
                [_outcome_values(outcome) for outcome in outcomes],
            )
        next_calls = [
            (key, advance, length) for key, (advance, length) in advances.items() if isinstance(advance, NextCall)
        ]
        if next_calls:
            connection.execute(
                insert(PipelineCallRow).on_conflict_do_nothing(index_elements=["run_id", "item_key", "step"]),
                [call_row(run_id, key, advance, length) for key, advance, length in next_calls],
            )
            connection.execute(
                update(PipelineItemRow).where(*_running_item(run_id)).values(steps=bindparam("b_steps")),
                [{"b_key": key, "b_steps": advance.step} for key, advance, _ in next_calls],
            )
        for key, (advance, _) in advances.items():
            if not isinstance(advance, NextCall):
                connection.execute(
                    update(PipelineItemRow)
                    .where(PipelineItemRow.run_id == run_id, PipelineItemRow.key == key)
                    .where(PipelineItemRow.state == "running")
                    .values(**ended(advance, now))
                )
        if timing is not None:
            connection.execute(store.timing_upsert, asdict(timing))
    return True


def _outcome_values(outcome: CallOutcome) -> dict[str, Any]:
    return {
        "b_item_key": outcome.item_key,
        "b_step": outcome.step,
        "b_state": "failed" if outcome.error is not None else "done",
        "b_output": outcome.output,
        "b_prompt_tokens": outcome.prompt_tokens,
        "b_generated_tokens": outcome.generated_tokens,
        "b_finish_reason": outcome.finish_reason,
        "b_error": outcome.error,
    }


def _running_item(run_id: str) -> tuple[Any, ...]:
    """An item of the batch's, by its bound key, while it runs."""
    return (
        PipelineItemRow.run_id == run_id,
        PipelineItemRow.key == bindparam("b_key"),
        PipelineItemRow.state == "running",
    )


def ended(advance: Finished | Failed, now: float) -> dict[str, Any]:
    """An item's columns once its program returned or failed."""
    if isinstance(advance, Finished):
        return {"state": "done", "steps": advance.steps, "result": advance.result, "finished_at": now}
    return {"state": "failed", "steps": advance.steps, "error": advance.error[-ERROR_MAX:], "finished_at": now}


@retry_transient
def move_lane(store: Store, run_id: str, lane: int, seq: int) -> bool:
    """Move a lane on without storing anything (its task found nothing to claim)."""
    with store.engine.begin() as connection:
        moved = connection.execute(
            update(PipelineLaneRow)
            .where(PipelineLaneRow.run_id == run_id, PipelineLaneRow.lane == lane, PipelineLaneRow.seq == seq)
            .values(seq=seq + 1)
        )
    return changed_one(moved)


@retry_transient
def fail_claimed(store: Store, run_id: str, lane: int, error: str) -> int:
    """The items whose calls a lane holds fail with `error` (its task failed every attempt); their calls are
    released. How many items failed."""
    now = time.time()
    with store.engine.begin() as connection:
        held = (PipelineCallRow.run_id == run_id, PipelineCallRow.lane == lane, PipelineCallRow.state == "claimed")
        keys = list(connection.execute(select(PipelineCallRow.item_key).where(*held)).scalars())
        connection.execute(update(PipelineCallRow).where(*held).values(state="failed", error=error[-ERROR_MAX:]))
        connection.execute(
            update(PipelineItemRow)
            .where(PipelineItemRow.run_id == run_id, PipelineItemRow.key.in_(keys), PipelineItemRow.state == "running")
            .values(state="failed", error=error[-ERROR_MAX:], finished_at=now)
        )
    return len(keys)


@retry_transient
def items_running(store: Store, run_id: str) -> bool:
    """Whether any item has a call to make: a lane asks after every batch, so no counting."""
    with store.engine.connect() as connection:
        running = exists().where(PipelineItemRow.run_id == run_id, PipelineItemRow.state == "running")
        return bool(connection.execute(select(running)).scalar())


@retry_transient
def pipeline_counts(store: Store, run_id: str) -> dict[str, int]:
    """Items by state (running, done, failed, total), calls made, and tokens read and generated."""
    counts: dict[str, int] = defaultdict(int)
    with store.engine.connect() as connection:
        query = (
            select(PipelineItemRow.state, func.count())
            .where(PipelineItemRow.run_id == run_id)
            .group_by(PipelineItemRow.state)
        )
        for state, count in connection.execute(query):
            counts[state] += int(count)
        calls = connection.execute(
            select(
                func.count(),
                func.coalesce(func.sum(PipelineCallRow.prompt_tokens), 0),
                func.coalesce(func.sum(PipelineCallRow.generated_tokens), 0),
            ).where(PipelineCallRow.run_id == run_id, PipelineCallRow.state.in_(("done", "failed")))
        ).one()
    counts["total"] = counts["running"] + counts["done"] + counts["failed"]
    counts["calls"], counts["prompt_tokens"], counts["generated_tokens"] = (int(value or 0) for value in calls)
    return dict(counts)


@retry_transient
def item_rows(store: Store, run_id: str) -> list[PipelineItemRow]:
    with store.session() as session:
        query = select(PipelineItemRow).where(PipelineItemRow.run_id == run_id).order_by(PipelineItemRow.line)
        return list(session.scalars(query))


@retry_transient
def call_rows(store: Store, run_id: str) -> list[PipelineCallRow]:
    with store.session() as session:
        query = (
            select(PipelineCallRow)
            .where(PipelineCallRow.run_id == run_id)
            .order_by(PipelineCallRow.item_key, PipelineCallRow.step)
        )
        return list(session.scalars(query))
