"""A pipeline's rows on SQLite and Postgres: lanes claim shares of the pending calls, and a batch is stored once."""

from __future__ import annotations

import uuid

from sqlalchemy import inspect

from fedqueue.llm.pipelines.replay import Advance, Failed, Finished, NextCall
from fedqueue.llm.pipelines.request import Generate
from fedqueue.llm.pipelines.rows import (
    CallOutcome,
    call_row,
    call_rows,
    claim,
    fail_claimed,
    insert_items,
    item_rows,
    item_states,
    items_running,
    lane_seq,
    move_lane,
    open_lanes,
    pipeline_counts,
    store_batch,
)
from fedqueue.store import Store


def new_pipeline(store: Store, items: int) -> str:
    run_id = uuid.uuid4().hex
    store.create_run(run_id, "items.jsonl", {"program": "fq_pipelines:refine"}, 0, kind="llm")
    rows = [
        {"run_id": run_id, "key": f"i{n}", "input_id": f"i{n}", "line": n + 1, "item": {"n": n}, "state": "running"}
        for n in range(items)
    ]
    calls = [call_row(run_id, f"i{n}", NextCall(0, Generate(prompt=f"p{n}")), length=n) for n in range(items)]
    insert_items(store, rows, calls)
    insert_items(store, rows, calls)  # submitted again: kept as they are
    return run_id


def test_the_pipeline_tables_come_with_the_migration(store: Store) -> None:
    tables = set(inspect(store.engine).get_table_names())
    assert {"llm_pipeline_items", "llm_pipeline_calls", "llm_pipeline_lanes"} <= tables


def test_lanes_claim_equal_shares_longest_first_and_keep_what_they_hold(store: Store) -> None:
    run_id = new_pipeline(store, 10)
    assert open_lanes(store, run_id, 2) == [(0, 0), (1, 0)]
    assert open_lanes(store, run_id, 2) == [(0, 0), (1, 0)]
    first = claim(store, run_id, 0, most=4, lanes_count=2)
    assert [call.item_key for call in first] == ["i9", "i8", "i7", "i6"]  # capped by `most`, longest first
    assert [call.item_key for call in claim(store, run_id, 0, most=4, lanes_count=2)] == ["i9", "i8", "i7", "i6"]
    second = claim(store, run_id, 1, most=4, lanes_count=2)
    assert [call.item_key for call in second] == ["i5", "i4", "i3"]  # an equal share of the 6 left
    assert all(call.state == "claimed" and call.lane == 1 for call in second)


def test_a_batch_is_stored_once_with_each_items_next_call_or_end(store: Store) -> None:
    run_id = new_pipeline(store, 3)
    open_lanes(store, run_id, 1)
    held = claim(store, run_id, 0, most=8, lanes_count=1)
    outcomes = [CallOutcome(call.item_key, call.step, f"out-{call.item_key}", 3, 2, "stop") for call in held]
    advances: dict[str, tuple[Advance, int]] = {
        "i0": (NextCall(1, Generate(prompt="again")), 5),
        "i1": (Finished(1, {"answer": 1}), 0),
        "i2": (Failed(1, "Traceback ...\nValueError: bad"), 0),
    }
    assert store_batch(store, run_id, 0, 0, "w1", outcomes, advances)
    assert not store_batch(store, run_id, 0, 0, "w2", outcomes, {"i0": (Finished(1, None), 0)})  # delivered twice
    assert lane_seq(store, run_id, 0) == 1
    items = {row.key: row for row in item_rows(store, run_id)}
    assert (items["i0"].state, items["i0"].steps) == ("running", 1)
    assert (items["i1"].state, items["i1"].result) == ("done", {"answer": 1})
    assert items["i2"].state == "failed" and "ValueError: bad" in (items["i2"].error or "")
    calls = call_rows(store, run_id)
    assert [(c.item_key, c.step, c.state, c.worker, c.output, c.generated_tokens) for c in calls] == [
        ("i0", 0, "done", "w1", "out-i0", 2),
        ("i0", 1, "pending", None, None, None),
        ("i1", 0, "done", "w1", "out-i1", 2),
        ("i2", 0, "done", "w1", "out-i2", 2),
    ]
    state = item_states(store, run_id, ["i0"])
    assert [call.output for call in state["i0"][1]] == ["out-i0"] and state["i0"][0].item == {"n": 0}
    counts = pipeline_counts(store, run_id)
    assert (counts["running"], counts["done"], counts["failed"], counts["total"], counts["calls"]) == (1, 1, 1, 3, 3)
    assert counts["generated_tokens"] == 6
    assert items_running(store, run_id)
    last = claim(store, run_id, 0, most=8, lanes_count=1)
    failed = [CallOutcome("i0", 1, None, error="out of memory")]
    assert [call.item_key for call in last] == ["i0"]
    assert store_batch(store, run_id, 0, 1, "w1", failed, {"i0": (Failed(1, "step 1: out of memory"), 0)})
    assert not items_running(store, run_id)  # every item ended
    assert [(c.state, c.error) for c in call_rows(store, run_id) if c.step == 1] == [("failed", "out of memory")]
    assert move_lane(store, run_id, 0, 2) and not move_lane(store, run_id, 0, 2)


def test_a_lane_given_up_fails_the_items_it_holds(store: Store) -> None:
    run_id = new_pipeline(store, 4)
    open_lanes(store, run_id, 2)
    held = claim(store, run_id, 1, most=2, lanes_count=1)
    assert fail_claimed(store, run_id, 1, "worker lost 3 times") == 2
    items = {row.key: row.state for row in item_rows(store, run_id)}
    assert sorted(state for key, state in items.items() if key in {c.item_key for c in held}) == ["failed", "failed"]
    assert pipeline_counts(store, run_id)["running"] == 2


def test_a_lane_claims_calls_of_one_decoding_setting_the_one_most_calls_wait_for(store: Store) -> None:
    run_id = new_pipeline(store, 5)
    short = [call_row(run_id, f"i{n}", NextCall(1, Generate(prompt="p", max_new_tokens=8)), 50) for n in range(3)]
    insert_items(store, [], short)
    open_lanes(store, run_id, 2)
    first = claim(store, run_id, 0, most=8, lanes_count=1)
    assert [(call.step, call.settings) for call in first] == [(0, "{}")] * 5
    second = claim(store, run_id, 1, most=8, lanes_count=1)
    assert [(call.step, call.settings) for call in second] == [(1, '{"max_new_tokens": 8}')] * 3
