"""Where a run's time went, from stored task timings: worker lanes, overlap, efficiency. Pure functions."""

from __future__ import annotations

import itertools
import math
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fedqueue.store.schema import TaskTimingRow


@dataclass(frozen=True)
class Span:
    """One task of any job kind as its worker recorded it (UNIX seconds, phase times in ms)."""

    task: str  # its name within the run: "round 3 device 7", "round 3 aggregation"
    round_index: int | None  # None for kinds that do not run in rounds
    worker: str
    pid: int
    device_used: str
    state: str
    attempt: int
    enqueued_at: float
    started_at: float
    finished_at: float
    task_type: str = "train"  # train, aggregate, generate
    load_ms: float = 0.0
    compute_ms: float = 0.0
    upload_ms: float = 0.0
    pack: str | None = None  # FL: the pack of devices the task was trained in
    devices: int = 1  # how many devices' rows this span stands for (a vmapped pack's, merged)

    @property
    def busy_s(self) -> float:
        return max(0.0, self.finished_at - self.started_at)

    @property
    def wait_s(self) -> float:
        """Time in the queue: from enqueue to the start of the stored delivery."""
        return max(0.0, self.started_at - self.enqueued_at)

    @property
    def worker_key(self) -> tuple[str, int]:
        return (self.worker, self.pid)


@dataclass(frozen=True)
class Lane:
    """One slot of one worker process: tasks that never overlapped, in start order."""

    worker: str
    pid: int
    device_used: str
    slot: int
    spans: tuple[Span, ...]

    @property
    def label(self) -> str:
        return f"{self.worker} pid {self.pid} {self.device_used} #{self.slot}"


@dataclass(frozen=True)
class RoundMark:
    """A round of a kind that runs in rounds, as the timeline marks it: enqueued (dashed), aggregated (dotted)."""

    round_index: int
    enqueued_at: float
    aggregated_at: float | None = None


@dataclass(frozen=True)
class RoundWords:
    """How the pictures name a kind's rounds. FL's buffered runs count versions: a task of round r trained on
    version r - 1 (`shift` -1), and round r's start is where version r - 1 was published."""

    colour: str = "round"  # what a task's colour tells (the colour bar's label)
    mark: str = "r"  # before the number of a marked round
    marked: str = "round enqueued"  # what a dashed line marks
    aggregation: str = "aggregation task"  # what the dark bars are
    shift: int = 0  # the number shown for round r is r + shift


def span_of(row: TaskTimingRow) -> Span:
    return Span(
        task=row.task,
        round_index=row.round_index,
        task_type=row.task_type,
        worker=row.worker,
        pid=row.pid,
        device_used=row.device_used,
        state=row.state,
        attempt=row.attempt,
        enqueued_at=row.enqueued_at,
        started_at=row.started_at,
        finished_at=row.finished_at,
        load_ms=row.load_ms,
        compute_ms=row.compute_ms,
        upload_ms=row.upload_ms,
        pack=row.pack,
    )


def merge_vmapped_packs(spans: Iterable[Span]) -> list[Span]:
    """One span per vmapped pack: its devices' rows share one timing, so they are one computation, not several.

    Rows of a sequential pack (back to back, each its own timing) stay one per device.
    """
    merged: list[Span] = []
    shared: dict[tuple[object, ...], list[Span]] = defaultdict(list)
    for span in spans:
        if span.pack is None:
            merged.append(span)
        else:
            key = (span.pack, span.round_index, span.worker, span.pid, span.started_at, span.finished_at, span.state)
            shared[key].append(span)
    for members in shared.values():
        if len(members) == 1:
            merged.append(members[0])
            continue
        first = members[0]
        task = f"round {first.round_index} {first.pack} ({len(members)} devices)"
        merged.append(replace(first, task=task, devices=len(members)))
    merged.sort(key=lambda span: (span.started_at, span.task))
    return merged


def pack_lanes(spans: Iterable[Span]) -> list[Lane]:
    """Each worker's tasks packed into the fewest lanes with no overlap (greedy interval colouring).

    Sorted by start, each task takes the lowest lane already free; for intervals this greedy
    order is optimal, so a worker gets exactly as many lanes as its peak of concurrent tasks.
    Failed tasks (which never ran) and zero-length ones are left out.
    """
    by_worker: dict[tuple[str, int], list[Span]] = defaultdict(list)
    for span in spans:
        if span.state == "done" and span.busy_s > 0:
            by_worker[span.worker_key].append(span)
    lanes: list[Lane] = []
    for (worker, pid), mine in sorted(by_worker.items()):
        mine.sort(key=lambda span: (span.started_at, span.finished_at, span.task))
        ends: list[float] = []
        members: list[list[Span]] = []
        for span in mine:
            # Touching is not overlapping: a slot that finished at t can start again at t.
            free = next((index for index, end in enumerate(ends) if end <= span.started_at), None)
            if free is None:
                ends.append(span.finished_at)
                members.append([span])
            else:
                ends[free] = span.finished_at
                members[free].append(span)
        device = Counter(span.device_used for span in mine).most_common(1)[0][0]
        lanes.extend(
            Lane(worker=worker, pid=pid, device_used=device, slot=slot, spans=tuple(found))
            for slot, found in enumerate(members)
        )
    return lanes


def concurrency_steps(intervals: Iterable[tuple[float, float]]) -> list[tuple[float, int]]:
    """(time, tasks running from then on) at every change, in time order."""
    deltas: dict[float, int] = defaultdict(int)
    for start, finish in intervals:
        if finish > start:
            deltas[start] += 1
            deltas[finish] -= 1
    steps: list[tuple[float, int]] = []
    running = 0
    for instant in sorted(deltas):
        if deltas[instant] == 0:
            continue  # one task ended as another began: no change
        running += deltas[instant]
        steps.append((instant, running))
    return steps


def parallel_efficiency(busy_s: float, wall_s: float, slots: int) -> float | None:
    """Share of the slots' time spent running tasks: busy / (wall x slots); None when undefined."""
    if wall_s <= 0 or slots <= 0:
        return None
    return busy_s / (wall_s * slots)


def dispatch_gaps(lanes: Sequence[Lane]) -> list[float]:
    """Idle time of a slot between two tasks when the second one was already waiting in the queue.

    That is the per-task cost outside the task's own timing: storing the result, the round's
    completion check, the ack and fetching the next message.
    """
    gaps: list[float] = []
    for lane in lanes:
        for before, after in itertools.pairwise(lane.spans):
            if after.enqueued_at <= before.finished_at:
                gaps.append(max(0.0, after.started_at - before.finished_at))
    return gaps


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0..100) with linear interpolation between ranks, as numpy's default."""
    if not 0 <= q <= 100:
        raise ValueError(f"percentile: q must be in [0, 100], got {q}")
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low = math.floor(rank)
    high = math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def idle_while_queued(lanes: Sequence[Lane], spans: Iterable[Span], start: float, end: float) -> tuple[float, float]:
    """Slot-seconds in [start, end] that slots sat idle while a task of the run waited in the queue: (before each
    slot's first task, as its worker started; after it, the slot's dispatch gaps included).

    A task waits from its enqueue to its start. An idle slot with nothing waiting is left out of both: the run
    was being planned, or a round's last tasks, its aggregation or evaluation ran elsewhere.
    """
    waiting = _merged((span.enqueued_at, span.started_at) for span in spans)
    starting = after = 0.0
    for lane in lanes:
        if not lane.spans:
            continue
        first = max(start, min(span.started_at for span in lane.spans))
        idle = _gaps(_merged((span.started_at, span.finished_at) for span in lane.spans), start, end)
        starting += _overlap(idle, waiting, start, first)
        after += _overlap(idle, waiting, first, end)
    return starting, after


def _merged(intervals: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    """Sorted, disjoint intervals covering the same time; empty ones dropped."""
    out: list[tuple[float, float]] = []
    for low, high in sorted(interval for interval in intervals if interval[1] > interval[0]):
        if out and low <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], high))
        else:
            out.append((low, high))
    return out


def _gaps(covered: Sequence[tuple[float, float]], start: float, end: float) -> list[tuple[float, float]]:
    """The parts of [start, end] that sorted, disjoint `covered` intervals leave free."""
    free: list[tuple[float, float]] = []
    cursor = start
    for low, high in covered:
        if low > cursor:
            free.append((cursor, min(low, end)))
        cursor = max(cursor, high)
        if cursor >= end:
            break
    if cursor < end:
        free.append((cursor, end))
    return [(low, high) for low, high in free if high > low]


def _overlap(
    first: Sequence[tuple[float, float]], second: Sequence[tuple[float, float]], start: float, end: float
) -> float:
    """Seconds within [start, end] that two sorted, disjoint interval lists share."""
    total = 0.0
    i = j = 0
    while i < len(first) and j < len(second):
        low = max(first[i][0], second[j][0], start)
        high = min(first[i][1], second[j][1], end)
        total += max(0.0, high - low)
        if first[i][1] < second[j][1]:
            i += 1
        else:
            j += 1
    return total
