"""FedAvg's sum begun in a round's tail: the updates that come first in device order, folded while the last
devices still train.

FedAvg divides by the round's total of samples only at its step (fedqueue.fl.ml.aggregate.FedAvgSum), so the
aggregator that waits in the tail (fedqueue.fl.strategy.sync.read_ahead) can fold each update read ahead as
soon as every update before it in device order is folded too. It folds on one thread (the other cores train
the round's last devices) and one update at a time, so it sees the round complete between two. The aggregation
then folds the rest on every thread, the same arithmetic in the same order, and begins again from nothing when
what was folded is not the round's first updates (a device retried, a pack split up): the result never depends
on how much was folded early.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from fedqueue.fl.strategy.sync.round_updates import StoredUpdate, leading_done, updates_of

if TYPE_CHECKING:
    import torch
    from sqlalchemy.engine import Row

    from fedqueue.fl.ml.aggregate import FedAvgSum

EARLY_FOLD_THREADS = 1  # the aggregator's own slot: the other cores still train


class EarlyFold:
    """A round's FedAvg sum over its leading updates, and which updates it holds, in order."""

    def __init__(self, global_state: Mapping[str, torch.Tensor], selected: Sequence[int]) -> None:
        from fedqueue.fl.ml.aggregate import FedAvgSum  # torch, as in aggregation

        self.sum: FedAvgSum = FedAvgSum(global_state)
        self.folded: list[StoredUpdate] = []
        self._selected = list(selected)

    def advance(self, outcomes: Sequence[Row[Any]], take: Callable[[str], Mapping[str, torch.Tensor] | None]) -> bool:
        """Fold the next update in order if `take` hands its weights over (those read ahead, by update key); one
        at a time, so the round's completion is seen between two. True when one was folded."""
        leading = updates_of(leading_done(self._selected, outcomes))
        if len(leading) <= len(self.folded) or leading[: len(self.folded)] != self.folded:
            return False  # nothing new leads, or not the round's first updates after all (begun again later)
        update = leading[len(self.folded)]
        state = take(update.ref.key)
        if state is None:
            return False
        self.sum.fold([((update.device, update.samples, state), update.summed)], threads=EARLY_FOLD_THREADS)
        self.folded.append(update)
        return True

    def discard(self) -> None:
        """Give the sum back unused (nothing to do once stepped)."""
        self.sum.discard()

    def resumed(self, updates: Sequence[StoredUpdate]) -> tuple[FedAvgSum, int] | None:
        """The sum and how many of `updates` (the round's, in order) it holds; None (the sum given back) when
        it holds other updates than their first."""
        if list(updates[: len(self.folded)]) == self.folded:
            return self.sum, len(self.folded)
        self.sum.discard()
        self.folded = []
        return None
