"""What a follower shows of an FL run: a bar per round, or per version of a buffered-async run."""

from __future__ import annotations

import time

from fedqueue.core.jobs import ProgressBar
from fedqueue.fl.store.results import count_done, last_rounds
from fedqueue.fl.store.schedule_rows import get_schedule
from fedqueue.fl.store.schema import RoundRow
from fedqueue.fl.view.summary import mode_of
from fedqueue.store import Store

SHOWN = 12  # bars a follower shows: the last rounds (versions), the one in the making among them


class RoundProgress:
    def __init__(self, store: Store, run_id: str) -> None:
        self.store = store
        self.run_id = run_id
        run = store.get_run(run_id)
        # A buffered-async run shows a bar per version: the updates folded into it, of the buffer_size that make it.
        self.mode = mode_of(run)
        self.buffer_size = int(run.config.get("buffer_size") or 1)

    def bars(self) -> list[ProgressBar]:
        """The last SHOWN rounds' bars (versions'): a run of 10,000 versions shows where it is, not a screen per
        poll of every version (the table it ends with has every one)."""
        rows = last_rounds(self.store, self.run_id, SHOWN)
        if self.mode.asynchronous:
            return self._version_bars(rows)
        return [self._round_bar(row) for row in rows]

    def _round_bar(self, row: RoundRow) -> ProgressBar:
        index = row.round_index
        label = f"{self.mode.unit.singular} {index:>3}"
        total = len(row.selected)
        if row.state != "done":
            return ProgressBar(str(index), label, count_done(self.store, self.run_id, index), total, "devices")
        return ProgressBar(str(index), label, total, total, "devices", _note(row, sim=False), finished=True)

    def _version_bars(self, rows: list[RoundRow]) -> list[ProgressBar]:
        """Round row r stands for version r: made once buffer_size updates are folded into it. The one in the
        making counts the updates in the schedule's buffer; one the run ended before is left unfinished."""
        open_rows = [row for row in rows if row.state != "done"]
        buffered = 0
        ended = False
        if open_rows:
            schedule = get_schedule(self.store, self.run_id)
            buffered = 0 if schedule is None else len(schedule.state.get("buffer", []))
            ended = self.store.get_run(self.run_id).state != "running"
        bars = []
        for row in rows:
            index = row.round_index
            label = f"{self.mode.unit.singular} {index:>3}"
            if row.state == "done":
                note = _note(row, sim=True)
                bars.append(ProgressBar(str(index), label, self.buffer_size, self.buffer_size, "updates", note, True))
            else:
                note = "not made: the run ended first" if ended else ""
                bars.append(ProgressBar(str(index), label, buffered, self.buffer_size, "updates", note))
        return bars

    def wait(self, seconds: float) -> None:
        time.sleep(seconds)


def _note(row: RoundRow, sim: bool) -> str:
    """A closed round's or made version's wall time, simulated time (versions) and accuracy."""
    note = f"{(row.aggregated_at or 0) - row.enqueued_at:5.2f} s"
    if row.sim_time is not None and sim:
        note += f"  sim {row.sim_time:8.1f} s"
    if row.accuracy is not None:
        note += f"  accuracy {row.accuracy:.3f}"
    return note
