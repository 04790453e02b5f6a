"""Worker lanes, overlap steps, efficiency, dispatch gaps and percentiles: the report's pure arithmetic."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedqueue.report.summary import max_concurrency
from fedqueue.report.timeline import (
    Span,
    concurrency_steps,
    dispatch_gaps,
    pack_lanes,
    parallel_efficiency,
    percentile,
)


def span(
    start: float,
    finish: float,
    *,
    worker: str = "cpu0@h",
    pid: int = 1,
    device: int = 0,
    round_index: int = 1,
    state: str = "done",
    enqueued: float = 0.0,
) -> Span:
    return Span(
        task=f"round {round_index} device {device}",
        round_index=round_index,
        worker=worker,
        pid=pid,
        device_used="cpu",
        state=state,
        attempt=1,
        enqueued_at=enqueued,
        started_at=start,
        finished_at=finish,
    )


def test_overlapping_tasks_of_one_worker_get_separate_lanes_and_touching_ones_share() -> None:
    spans = [span(0, 2, device=0), span(1, 3, device=1), span(2, 4, device=2), span(3, 5, device=3)]
    lanes = pack_lanes(spans)
    assert [lane.slot for lane in lanes] == [0, 1]
    # Greedy by start: 0 and 2 (touching at t=2) share lane 0, 1 and 3 share lane 1.
    assert [[s.task[-1] for s in lane.spans] for lane in lanes] == [["0", "2"], ["1", "3"]]


def test_each_worker_process_has_its_own_lanes_and_failed_tasks_take_none() -> None:
    spans = [
        span(0, 1, worker="cpu0@h", pid=10, device=0),
        span(0, 1, worker="cpu0@h", pid=11, device=1),  # same name, restarted process: another worker
        span(0, 1, worker="cpu1@h", pid=12, device=2),
        span(0.5, 0.5, worker="cpu1@h", pid=12, device=3, state="failed"),
    ]
    lanes = pack_lanes(spans)
    assert [(lane.worker, lane.pid, lane.slot) for lane in lanes] == [
        ("cpu0@h", 10, 0),
        ("cpu0@h", 11, 0),
        ("cpu1@h", 12, 0),
    ]
    assert sum(len(lane.spans) for lane in lanes) == 3
    assert lanes[0].label == "cpu0@h pid 10 cpu #0"


intervals = st.lists(
    st.tuples(st.integers(0, 60), st.integers(1, 20)).map(lambda pair: (pair[0] / 4, (pair[0] + pair[1]) / 4)),
    max_size=40,
)


@settings(max_examples=200, deadline=None)
@given(intervals, st.integers(1, 3))
def test_lanes_are_as_few_as_the_peak_overlap_and_never_overlap_inside(pairs: list, workers: int) -> None:
    spans = [
        span(start, finish, device=index, worker=f"cpu{index % workers}@h")
        for index, (start, finish) in enumerate(pairs)
    ]
    lanes = pack_lanes(spans)
    assert sorted(s.task for lane in lanes for s in lane.spans) == sorted(s.task for s in spans)
    for lane in lanes:
        assert all(before.finished_at <= after.started_at for before, after in itertools.pairwise(lane.spans))
    for worker in {s.worker for s in spans}:
        mine = [(s.started_at, s.finished_at) for s in spans if s.worker == worker]
        assert sum(1 for lane in lanes if lane.worker == worker) == max_concurrency(mine)


@settings(max_examples=200, deadline=None)
@given(intervals)
def test_concurrency_steps_peak_at_the_max_overlap_and_end_at_zero(pairs: list) -> None:
    steps = concurrency_steps(pairs)
    assert max((running for _, running in steps), default=0) == max_concurrency(pairs)
    assert [instant for instant, _ in steps] == sorted({instant for instant, _ in steps})
    if steps:
        assert steps[-1][1] == 0


def test_concurrency_steps_by_hand() -> None:
    assert concurrency_steps([(0, 2), (1, 3), (2, 4)]) == [(0, 1), (1, 2), (3, 1), (4, 0)]


def test_parallel_efficiency() -> None:
    assert parallel_efficiency(busy_s=15.0, wall_s=10.0, slots=2) == pytest.approx(0.75)
    assert parallel_efficiency(busy_s=20.0, wall_s=10.0, slots=2) == pytest.approx(1.0)
    assert parallel_efficiency(busy_s=1.0, wall_s=0.0, slots=2) is None
    assert parallel_efficiency(busy_s=1.0, wall_s=1.0, slots=0) is None


def test_dispatch_gaps_count_only_when_the_next_task_was_already_waiting() -> None:
    lanes = pack_lanes(
        [
            span(0.0, 1.0, device=0, enqueued=0.0),
            span(1.25, 2.0, device=1, enqueued=0.0),  # waiting since 0: a gap of 0.25 s is overhead
            span(5.0, 6.0, device=2, enqueued=4.5),  # enqueued after the slot went idle: not a gap
        ]
    )
    assert dispatch_gaps(lanes) == [pytest.approx(0.25)]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(0, 1000, allow_nan=False), min_size=1, max_size=50), st.floats(0, 100))
def test_percentile_equals_numpys_linear_interpolation(values: list[float], q: float) -> None:
    assert percentile(values, q) == pytest.approx(float(np.percentile(values, q)), rel=1e-9, abs=1e-9)


def test_percentile_edges() -> None:
    assert percentile([], 95) is None
    assert percentile([3.0], 95) == 3.0
    assert percentile([0.0, 10.0], 95) == pytest.approx(9.5)
    with pytest.raises(ValueError, match="q must be in"):
        percentile([1.0], 101)


def test_a_vmapped_pack_is_one_task_and_a_sequential_pack_stays_per_device() -> None:
    from dataclasses import replace

    from fedqueue.report.timeline import merge_vmapped_packs

    vmapped = [replace(span(1.0, 3.0, device=d), pack="pack 0-2") for d in (0, 1, 2)]
    sequential = [replace(span(3.0 + d, 4.0 + d, device=d), pack="pack 3-5") for d in (3, 4, 5)]
    alone = span(0.0, 1.0, device=9)
    merged = merge_vmapped_packs([*sequential, alone, *vmapped])
    assert [(s.task, s.devices) for s in merged] == [
        ("round 1 device 9", 1),
        ("round 1 pack 0-2 (3 devices)", 3),
        ("round 1 device 3", 1),
        ("round 1 device 4", 1),
        ("round 1 device 5", 1),
    ]
    assert len(pack_lanes(merged)) == 1  # three rows of one vmapped computation are not three slots
