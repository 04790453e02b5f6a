"""TensorBoard event files of an FL run: one step per round or version, FedRevive's scalar names where it has one.

Who writes them: the process that follows the run (`fedqueue run`, `fedqueue resume`, `fedqueue.run()`), from
the rows the store holds, never the workers. A round or version is recorded once, in one transaction, whoever
made it: a fold pass that is retried or replayed writes the same row again instead of a second one, so reading
committed rows gives each step once without the workers agreeing on who writes, and a step's scalars come
from the same numbers `fedqueue status` shows. The folder is the user's, on the machine they follow from
rather than on every GPU host, and a run has one follower at a time (its lease): one writer, one event file.
`fedqueue report RUN --tensorboard DIR` writes the same scalars afterwards from the same rows.

Nothing is written twice for the same step: a writer first reads the event files already in the run's folder
(a follower before it, a report) and writes only the (tag, step) pairs they lack, under a lock on the folder,
so two writers on one host never interleave. Each writer appends to an event file of its own.

Scalars, at step = round (synchronous) or version (buffered), each event stamped with when it was made:

- test/accuracy, test/loss: the version's evaluation (every eval_every, and the last);
  label_wise/accuracy_i, label_wise/loss_i: the same for class i;
- test/time: the simulated time when it was made (runs that model simulated time);
- train/loss: the mean training loss of the updates it was made from;
- aggregation/avg_staleness: the mean staleness of the updates folded into it (buffered runs);
- fedqueue/wall_seconds: seconds from the step before to this one, as `fedqueue status` shows them;
  fedqueue/aggregate_ms, fedqueue/eval_ms: making and evaluating it;
- fedqueue/device_tasks_per_second, fedqueue/worker_utilization, fedqueue/tasks_redone: device trainings
  that ended, the share of the worker slots' time spent in tasks, and device trainings that ended on a second
  or later attempt, over the wall time since the step before (at least WINDOW_MIN_S of it).
"""

from __future__ import annotations

import bisect
import contextlib
import fcntl
import itertools
import logging
import os
import struct
import time
import uuid
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import func, select

from fedqueue.core.jobs import ProgressBar, RunProgress
from fedqueue.core.process.writable import writable_folder
from fedqueue.fl.store.results import list_rounds
from fedqueue.fl.store.schema import DeviceTaskRow, RoundRow
from fedqueue.fl.view.summary import mode_of, models_sim_time
from fedqueue.report.run_data import read_spans
from fedqueue.report.timeline import Span, merge_vmapped_packs, pack_lanes
from fedqueue.store import Store
from fedqueue.store.schema import RunRow

if TYPE_CHECKING:
    from tensorboardX.event_file_writer import EventsWriter

log = logging.getLogger(__name__)

POLL_EVERY_S = 1.0  # a follower looks for new steps at most this often (and once more when the run has ended)
WINDOW_MIN_S = 0.05  # versions made in one fold pass share the window since the one before them
EVENT_FILES = "events.out.tfevents.*"


@dataclass(frozen=True)
class Point:
    """One scalar at one step; `wall_time` is when its round or version was made."""

    tag: str
    step: int
    value: float
    wall_time: float


def run_folder(root: str | os.PathLike[str], run_id: str) -> Path:
    """Where a run's event files go: a folder named by its id under the TensorBoard folder."""
    return Path(root) / run_id


def check_folder(root: str | os.PathLike[str], name: str = "tensorboard_dir") -> Path:
    """The TensorBoard folder, made, and proved to take files; else ConfigError naming `name`."""
    return writable_folder(root, name)


# Reading event files back: TFRecord framing (length, its CRC, the data, its CRC) around Event protocol buffers.
_HEADER = struct.Struct("<QI")
_FOOTER_BYTES = 4


def _records(data: bytes) -> tuple[list[bytes], int]:
    """The whole records in `data` and how many bytes they take (a record still being written is left)."""
    records: list[bytes] = []
    offset = 0
    while len(data) - offset >= _HEADER.size:
        (length, _crc) = _HEADER.unpack_from(data, offset)
        end = offset + _HEADER.size + length + _FOOTER_BYTES
        if end > len(data):
            break
        records.append(data[offset + _HEADER.size : offset + _HEADER.size + length])
        offset = end
    return records, offset


class ScalarFiles:
    """The event files of one run's folder: which (tag, step) pairs they hold, and an event file of this writer's."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.written: set[tuple[str, int]] = set()
        self._read_to: dict[Path, int] = {}
        self._writer: EventsWriter | None = None

    def write(self, points: Iterable[Point]) -> int:
        """Write the points no event file in the folder holds yet (by tag and step); how many were written."""
        points = list(points)
        if not points:
            return 0
        self.folder.mkdir(parents=True, exist_ok=True)
        with self._locked():
            self._read_others()
            fresh = [point for point in points if (point.tag, point.step) not in self.written]
            if fresh:
                self._append(fresh)
        return len(fresh)

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        descriptor = os.open(self.folder, os.O_RDONLY)
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX)
            yield
        finally:
            os.close(descriptor)  # closing lets the lock go

    def _read_others(self) -> None:
        """Add what the folder's event files hold beyond where this writer last read them (its own file too)."""
        from google.protobuf.message import DecodeError
        from tensorboardX.proto.event_pb2 import Event

        for path in sorted(self.folder.glob(EVENT_FILES)):
            start = self._read_to.get(path, 0)
            with path.open("rb") as file:
                file.seek(start)
                records, used = _records(file.read())
            for record in records:
                try:
                    event = Event.FromString(record)
                except DecodeError:
                    break  # a damaged file: what it holds past here is not counted (nor read again)
                self.written.update((value.tag, int(event.step)) for value in event.summary.value)
            self._read_to[path] = start + used

    def _append(self, points: Sequence[Point]) -> None:
        from tensorboardX.event_file_writer import EventsWriter
        from tensorboardX.proto.event_pb2 import Event
        from tensorboardX.proto.summary_pb2 import Summary

        if self._writer is None:
            # Named by the time, the host and (the suffix) this process and writer: two writers never share a file.
            self._writer = EventsWriter(str(self.folder / "events"), f".{os.getpid()}.{uuid.uuid4().hex[:6]}")
        by_step: dict[int, list[Point]] = {}
        for point in points:
            by_step.setdefault(point.step, []).append(point)
        for step in sorted(by_step):
            values = [Summary.Value(tag=point.tag, simple_value=point.value) for point in by_step[step]]
            event = Event(wall_time=by_step[step][0].wall_time, step=step, summary=Summary(value=values))
            self._writer.write_event(event)
            self.written.update((point.tag, step) for point in by_step[step])
        self._writer.flush()  # on disk before the lock goes: TensorBoard and other writers see it now


# What the scalars are made of.


def row_points(row: RoundRow, simulated: bool) -> list[Point]:
    """The scalars a done round or version carries in its own row."""
    step, made = row.round_index, row.aggregated_at or row.enqueued_at
    values: dict[str, float | None] = {
        "test/accuracy": row.accuracy,
        "test/loss": row.loss,
        "test/time": row.sim_time if simulated else None,
        "train/loss": row.train_loss,
        "fedqueue/wall_seconds": None if row.aggregated_at is None else row.aggregated_at - row.enqueued_at,
        "fedqueue/aggregate_ms": row.aggregate_ms,
        "fedqueue/eval_ms": row.eval_ms,
    }
    for name in ("accuracy", "loss"):
        for label, value in enumerate((row.label_wise or {}).get(name) or []):
            values[f"label_wise/{name}_{label}"] = value
    return [Point(tag, step, float(value), made) for tag, value in values.items() if value is not None]


def window_start(made: Sequence[float], index: int, created_at: float) -> float:
    """Where the window of the step made at `made[index]` begins: the latest earlier step made at least
    WINDOW_MIN_S before it, else the run's creation. `made` lists the steps' times in step order (ascending)."""
    end = made[index]
    before = bisect.bisect_right(made, end - WINDOW_MIN_S, 0, index)
    return made[before - 1] if before > 0 else min(created_at, end)


class TaskWindows:
    """The run's task timings, sorted to answer per window: device trainings that ended in it (and on a later
    attempt), and the slot-seconds spent in tasks within it."""

    def __init__(self, tasks: Sequence[Span]) -> None:
        trained = sorted((task for task in tasks if task.task_type == "train"), key=lambda task: task.finished_at)
        self._ended = [task.finished_at for task in trained]
        self._done = list(itertools.accumulate((task.state == "done" for task in trained), initial=0))
        self._redone = list(itertools.accumulate((task.attempt > 1 for task in trained), initial=0))
        # Busy time as the report counts it: tasks that ran to the end, a vmapped pack once.
        spans = [span for span in merge_vmapped_packs(tasks) if span.state == "done"]
        self._spans = sorted(spans, key=lambda span: span.finished_at)
        self._span_ends = [span.finished_at for span in self._spans]
        self._longest = max((span.busy_s for span in spans), default=0.0)
        self.slots = len(pack_lanes(spans))

    def points(self, step: int, start: float, end: float, slots: int) -> list[Point]:
        """Device trainings per second, worker utilization and trainings redone between `start` and `end`."""
        seconds = end - start
        if seconds <= 0:
            return []
        first, last = bisect.bisect_right(self._ended, start), bisect.bisect_right(self._ended, end)
        points = [
            Point("fedqueue/device_tasks_per_second", step, (self._done[last] - self._done[first]) / seconds, end),
            Point("fedqueue/tasks_redone", step, float(self._redone[last] - self._redone[first]), end),
        ]
        if slots > 0:
            # A span in the window ends after its start, and no later than its end plus the longest span.
            low = bisect.bisect_right(self._span_ends, start)
            high = bisect.bisect_right(self._span_ends, end + self._longest)
            busy = sum(_overlap(span, start, end) for span in self._spans[low:high])
            points.append(Point("fedqueue/worker_utilization", step, busy / (seconds * slots), end))
        return points


def _overlap(span: Span, start: float, end: float) -> float:
    return max(0.0, min(span.finished_at, end) - max(span.started_at, start))


def staleness_points(store: Store, run_id: str, made: dict[int, float]) -> list[Point]:
    """aggregation/avg_staleness of each of these versions (by number: when it was made)."""
    if not made:
        return []
    query = (
        select(DeviceTaskRow.folded_into, func.avg(DeviceTaskRow.staleness))
        .where(
            DeviceTaskRow.run_id == run_id,
            DeviceTaskRow.fate == "folded",
            DeviceTaskRow.folded_into.between(min(made), max(made)),
        )
        .group_by(DeviceTaskRow.folded_into)
    )
    with store.engine.connect() as connection:
        found = list(connection.execute(query))
    return [
        Point("aggregation/avg_staleness", int(version), float(mean), made[int(version)])
        for version, mean in found
        if version in made and mean is not None
    ]


def settled_through(rows: Sequence[RoundRow], floor: int = 0) -> int:
    """The last step whose window no task still running can add to: every device sent off up to it has its
    result stored (a buffered run's slow devices arrive versions later), and a later step is done (so the
    aggregation that made it has its timing stored too). 0 when none. `rows` may start past `floor`, a step up
    to which every step is done and stored whole."""
    done = [row.round_index for row in rows if row.state == "done"]
    stored_through = floor
    for row in rows:
        if row.stored < len(row.selected):
            break
        stored_through = row.round_index
    return min(stored_through, max(done, default=max(floor, 1)) - 1)


class RunScalars:
    """A run's scalars written as its rounds or versions are made: each `poll` writes those of the steps done
    since (and a late evaluation of one done before); the poll that finds the run ended writes the rest and closes.

    A step's window scalars (fedqueue/device_tasks_per_second, worker_utilization, tasks_redone) wait until
    its window is settled (`settled_through`), so a follower writes the numbers a report would."""

    def __init__(self, store: Store, run_id: str, root: str | os.PathLike[str], every_s: float = POLL_EVERY_S) -> None:
        self.store = store
        self.run_id = run_id
        self.every_s = every_s
        self.files = ScalarFiles(run_folder(check_folder(root), run_id))
        self._rows: set[int] = set()  # steps whose rows' scalars were written
        self._windowed: set[int] = set()  # steps whose window scalars were written
        self._staleness: set[int] = set()  # versions whose staleness was written
        self._slots = 0  # worker slots seen so far
        # Steps up to the floor are done, stored whole and written whole: not read again (a poll of a run of
        # 10,000 versions read them all, 0.6 s a second); when each was made, in step order.
        self._floor = 0
        self._made_below: list[float] = []
        self._next_poll = 0.0
        self.closed = False

    def poll(self, force: bool = False) -> int:
        """Write what is new (at most once per `every_s`, unless `force` or the run has ended); the scalars written."""
        if self.closed:
            return 0
        run = self.store.get_run(self.run_id)
        ended = run.state != "running"  # read first: every row made before it ended is read below
        if not (force or ended) and time.monotonic() < self._next_poll:
            return 0
        self._next_poll = time.monotonic() + self.every_s
        written = self.files.write(self.points(run, ended))
        if ended:
            self.close()
        return written

    def points(self, run: RunRow, ended: bool) -> list[Point]:
        """The scalars of every done step (those already in the files are left out when written)."""
        rows = list_rounds(self.store, self.run_id, after=self._floor)
        done = [row for row in rows if row.state == "done"]
        below = len(self._made_below)  # done steps under the floor: done[i] is the run's (below + i)-th
        # A done row changes no more, but for the evaluation a stop rule adds to the last one as the run ends.
        fresh_rows = [row for row in done if row.round_index not in self._rows or (ended and row is done[-1])]
        points = [point for row in fresh_rows for point in row_points(row, models_sim_time(run))]
        self._rows.update(row.round_index for row in fresh_rows)
        made = self._made_below + [row.aggregated_at or row.enqueued_at for row in done]
        asynchronous = mode_of(run).asynchronous
        if asynchronous:
            fresh = {
                row.round_index: at
                for row, at in zip(done, made[below:], strict=True)
                if row.round_index not in self._staleness
            }
            points += staleness_points(self.store, self.run_id, fresh)
            self._staleness.update(fresh)
        settled = done[-1].round_index if ended and done else settled_through(rows, self._floor)
        pending = [
            i for i, row in enumerate(done) if row.round_index <= settled and row.round_index not in self._windowed
        ]
        if pending:
            windows = {i: (window_start(made, below + i, run.created_at), made[below + i]) for i in pending}
            tasks = TaskWindows(read_spans(self.store, self.run_id, min(start for start, _ in windows.values())))
            self._slots = max(self._slots, tasks.slots)
            for i, (start, end) in windows.items():
                points += tasks.points(done[i].round_index, start, end, self._slots)
            self._windowed.update(done[i].round_index for i in pending)
        self._raise_floor(rows, done, made[below:], asynchronous)
        return points

    def _raise_floor(
        self, rows: Sequence[RoundRow], done: Sequence[RoundRow], made: Sequence[float], asynchronous: bool
    ) -> None:
        """Past the steps, from the floor on, that are done, stored whole and written whole, but the last done
        one (a stop rule may still add its evaluation)."""
        made_at = {row.round_index: at for row, at in zip(done, made, strict=True)}
        last = done[-1].round_index if done else self._floor
        for row in rows:
            written = row.round_index in self._rows and row.round_index in self._windowed
            if (
                row.round_index != self._floor + 1
                or row.round_index >= last
                or row.state != "done"
                or row.stored < len(row.selected)
                or not written
                or (asynchronous and row.round_index not in self._staleness)
            ):
                break
            self._made_below.append(made_at[row.round_index])
            self._floor = row.round_index

    def close(self) -> None:
        self.closed = True
        self.files.close()


def write_run_scalars(store: Store, run_id: str, root: str | os.PathLike[str]) -> tuple[Path, int]:
    """Every scalar of a run's done rounds or versions the folder lacks (`fedqueue report --tensorboard`):
    the run's folder, and how many scalars were written."""
    scalars = RunScalars(store, run_id, root)
    try:
        return scalars.files.folder, scalars.poll(force=True)
    finally:
        scalars.close()


def configured_root(run: RunRow) -> str | None:
    root = run.config.get("tensorboard_dir")
    return root if isinstance(root, str) and root else None


class ScalarsProgress:
    """A follower's progress (its bars) that writes the run's scalars on its polls."""

    def __init__(self, progress: RunProgress, scalars: RunScalars) -> None:
        self.progress = progress
        self.scalars = scalars

    def bars(self) -> list[ProgressBar]:
        poll_scalars(self.scalars)
        return self.progress.bars()

    def wait(self, seconds: float) -> None:
        self.progress.wait(seconds)


def poll_scalars(scalars: RunScalars, force: bool = False) -> None:
    """A follower's poll: a folder that stops taking files (a full disk) is said once, and following goes on."""
    try:
        scalars.poll(force)
    except OSError as err:
        log.warning("run %s: TensorBoard files no longer written to %s (%s)", scalars.run_id, scalars.files.folder, err)
        scalars.close()


def with_scalars(progress: RunProgress, store: Store, run_id: str) -> RunProgress:
    """The follower's progress, writing the run's scalars as it goes when its config names a tensorboard_dir."""
    root = configured_root(store.get_run(run_id))
    if root is None:
        return progress
    return ScalarsProgress(progress, RunScalars(store, run_id, root))


@contextlib.contextmanager
def following(store: Store, run_id: str) -> Iterator[Any]:
    """For a follower of its own (`fedqueue.run()`): a poll to call on every tick, the rest written on the way out."""
    root = configured_root(store.get_run(run_id))
    if root is None:
        yield lambda: None
        return
    scalars = RunScalars(store, run_id, root)
    try:
        yield lambda: poll_scalars(scalars)
        poll_scalars(scalars, force=True)
    finally:
        scalars.close()
