"""FedAvg's sum begun in a round's tail: only the round's first updates in device order are folded early, and
the aggregation's result is bit for bit the one folded from nothing, however much was folded before.

Pure logic: result rows are plain records here (the queue test is tests/fl/strategy/sync/test_read_ahead.py).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import pytest
import torch

from fedqueue.fl.messages import pack_sum_key
from fedqueue.fl.ml.aggregate import FedAvgSum, fedavg
from fedqueue.fl.strategy.sync.early_fold import EarlyFold
from fedqueue.fl.strategy.sync.round_updates import updates_of

State = dict[str, torch.Tensor]


@dataclass(frozen=True)
class _Result:
    device: int
    state: str
    samples: int
    update_key: str | None
    update_sha256: str | None = "0" * 64
    update_nbytes: int | None = 1


def _state(seed: int) -> State:
    generator = torch.Generator().manual_seed(seed)
    # Magnitudes over many decades make the float64 sum depend on its order.
    scale = 10.0 ** torch.randint(-6, 7, (300,), generator=generator)
    return {
        "w": (torch.randn(300, generator=generator, dtype=torch.float64) * scale).float(),
        "count": torch.tensor(seed, dtype=torch.int64),
    }


def _pack_sum(base: State, members: list[tuple[int, int, State]]) -> State:
    summed = torch.zeros(300, dtype=torch.float64)
    for _, samples, state in members:
        summed += (state["w"].double() - base["w"].double()) * samples
    return {"w": summed, "count": members[0][2]["count"]}


def _advance(early: EarlyFold, round_: _Round, take: Callable[[str], State | None] | None = None) -> int:
    """Fold what leads, one update a call, as the read-ahead does; how many calls folded one."""
    folded = 0
    while early.advance(round_.rows(), take or round_.take):
        folded += 1
    return folded


def _same(left: Mapping[str, torch.Tensor], right: Mapping[str, torch.Tensor]) -> bool:
    return left.keys() == right.keys() and all(torch.equal(left[name], right[name]) for name in left)


class _Round:
    """Devices 1, 3, 5, 7 and a pack of 8 and 9: their states, their weights by key, their result rows."""

    def __init__(self) -> None:
        self.base = _state(0)
        self.alone = [(device, 10 + device, _state(device)) for device in (1, 3, 5, 7)]
        self.pack = [(device, 10 + device, _state(device)) for device in (8, 9)]
        self.pack_key = pack_sum_key("run", 1, [8, 9])
        self.weights: dict[str, State] = {f"run/update/1/{device}": state for device, _, state in self.alone}
        self.weights[self.pack_key] = _pack_sum(self.base, self.pack)
        self.results: dict[int, _Result] = {}

    def store(self, *devices: int) -> None:
        for device, samples, _ in self.alone + self.pack:
            if device in devices:
                key = self.pack_key if device in (8, 9) else f"run/update/1/{device}"
                self.results[device] = _Result(device, "done", samples, key)

    def rows(self) -> list[Any]:
        """The results as the store hands them over (light rows: these records stand in for them)."""
        return list(self.results.values())

    def take(self, key: str) -> State | None:
        return self.weights.get(key)

    def expected(self) -> State:
        samples = sum(samples for _, samples, _ in self.pack)
        summed = (8, samples, self.weights[self.pack_key])
        return fedavg(self.base, self.alone, 0.7, sums=[summed])


def test_only_the_leading_updates_are_folded_and_the_step_matches_a_fresh_fold() -> None:
    round_ = _Round()
    early = EarlyFold(round_.base, [1, 3, 5, 7, 8, 9])
    round_.store(1, 5, 8, 9)  # 3 still trains: 5 and the pack wait behind it
    assert _advance(early, round_) == 1
    assert [update.device for update in early.folded] == [1]
    round_.store(3)
    assert _advance(early, round_) == 2
    # 7 still trains: the pack (lowest device 8) comes after it.
    assert [update.device for update in early.folded] == [1, 3, 5]
    round_.store(7)
    updates = updates_of(round_.rows())
    assert [(update.device, update.summed) for update in updates] == [
        (1, False),
        (3, False),
        (5, False),
        (7, False),
        (8, True),
    ]

    resumed = early.resumed(updates)
    assert resumed is not None
    folding, done = resumed
    assert done == 3
    rest = updates[done:]
    folding.fold([((u.device, u.samples, round_.weights[u.ref.key]), u.summed) for u in rest])
    assert _same(folding.step(0.7), round_.expected())


def test_an_update_not_read_yet_stops_the_fold_there() -> None:
    round_ = _Round()
    early = EarlyFold(round_.base, [1, 3, 5, 7, 8, 9])
    round_.store(1, 3, 5)
    unread = "run/update/1/3"
    _advance(early, round_, lambda key: None if key == unread else round_.take(key))
    assert [update.device for update in early.folded] == [1]
    _advance(early, round_)
    assert [update.device for update in early.folded] == [1, 3, 5]
    early.discard()


def test_a_failed_device_stops_the_early_fold() -> None:
    round_ = _Round()
    early = EarlyFold(round_.base, [1, 3, 5, 7, 8, 9])
    round_.store(1, 5)
    round_.results[3] = _Result(3, "failed", 13, None)
    _advance(early, round_)
    assert [update.device for update in early.folded] == [1]
    early.discard()


def test_a_sum_of_other_updates_is_given_up_and_the_fold_begins_again() -> None:
    """A device stored again by another delivery (another key) after it was folded: the sum is not the round's."""
    round_ = _Round()
    early = EarlyFold(round_.base, [1, 3, 5, 7, 8, 9])
    round_.store(1, 3)
    _advance(early, round_)
    assert len(early.folded) == 2
    round_.store(5, 7, 8, 9)
    round_.results[3] = _Result(3, "done", 13, "run/update/1/3-again")
    round_.weights["run/update/1/3-again"] = round_.weights["run/update/1/3"]
    updates = updates_of(round_.rows())
    assert early.resumed(updates) is None
    assert early.folded == []
    folding = FedAvgSum(round_.base)
    folding.fold([((u.device, u.samples, round_.weights[u.ref.key]), u.summed) for u in updates])
    assert _same(folding.step(0.7), round_.expected())
    early.discard()  # already given back: nothing to do


def test_a_fedavg_sum_folds_in_device_order_once() -> None:
    base = _state(0)
    folding = FedAvgSum(base)
    folding.fold([((4, 1, _state(4)), False)])
    with pytest.raises(ValueError, match="device 2 after device 4"):
        folding.fold([((2, 1, _state(2)), False)])
    with pytest.raises(ValueError, match="reported -1 samples"):
        folding.fold([((5, -1, _state(5)), False)])
    folding.step(1.0)
    with pytest.raises(RuntimeError, match="already stepped"):
        folding.fold([((6, 1, _state(6)), False)])
    folding.discard()  # nothing left to give back
    with pytest.raises(ValueError, match="at least one update"):
        FedAvgSum(base).step(1.0)


def test_folded_in_pieces_gives_the_bits_of_one_fold() -> None:
    base = _state(0)
    updates = [(device, 3 + device, _state(device + 1)) for device in range(6)]
    expected = fedavg(base, updates, 0.9)
    for cut in range(1, 6):
        folding = FedAvgSum(base)
        folding.fold([(update, False) for update in updates[:cut]], threads=1)
        folding.fold([(update, False) for update in updates[cut:]])
        assert _same(folding.step(0.9), expected), cut
