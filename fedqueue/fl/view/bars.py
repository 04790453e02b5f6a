"""What a follower shows of an FL run: a bar per round, or per version of a buffered-async run."""

from __future__ import annotations

import time

from fedqueue.core.jobs import ProgressBar
from fedqueue.fl.store.results import count_done, list_rounds
from fedqueue.fl.store.schema import RoundRow
from fedqueue.fl.view.summary import is_buffered
from fedqueue.store import Store


class RoundProgress:
    def __init__(self, store: Store, run_id: str) -> None:
        self.store = store
        self.run_id = run_id
        # A buffered-async run shows a bar per version: the devices sent off with the version before it.
        self.buffered = is_buffered(store.get_run(run_id))

    def bars(self) -> list[ProgressBar]:
        return [self._bar(row) for row in list_rounds(self.store, self.run_id)]

    def _bar(self, row: RoundRow) -> ProgressBar:
        index = row.round_index
        label = f"version {index:>3}" if self.buffered else f"round {index:>3}"
        unit = f"trained on v{index - 1}" if self.buffered else "devices"
        total = len(row.selected)
        if row.state != "done":
            # A buffered-async version's devices keep being sent off until it is made.
            return ProgressBar(str(index), label, count_done(self.store, self.run_id, index), total, unit)
        note = f"{(row.aggregated_at or 0) - row.enqueued_at:5.2f} s"
        if row.sim_time is not None and self.buffered:
            note += f"  sim {row.sim_time:8.1f} s"
        if row.accuracy is not None:
            note += f"  accuracy {row.accuracy:.3f}"
        # A version is made while some devices sent off with the one before still train.
        completed = count_done(self.store, self.run_id, index) if self.buffered else total
        return ProgressBar(str(index), label, completed, total, unit, note, finished=True)

    def wait(self, seconds: float) -> None:
        time.sleep(seconds)
