"""A version rule: how the fold pass makes a version from the current one and its buffer of arrivals.

The fold pass (fold.py) runs the schedule, reads what is stored and publishes what is made; the rule is
the arithmetic between. FedBuff's own is the plain buffered fold below; FedRevive mixes each update with
a distilled one (fedqueue.fl.strategy.fedrevive.rule), FedAsync mixes one update at a time into the
current version (fedqueue.fl.strategy.fedasync.rule).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, TypeVar

from fedqueue.fl.strategy.fedbuff.mode import FEDBUFF

if TYPE_CHECKING:
    import torch

    from fedqueue.fl.config import RunConfig
    from fedqueue.fl.strategy.fedbuff.schedule import NewVersion, Rules, Trip
    from fedqueue.fl.strategy.mode import Mode
    from fedqueue.fl.worker.cache import WorkerCache

T = TypeVar("T")
State = Mapping[str, "torch.Tensor"]
# (staleness weight, the version it trained on, its trained weights), in arrival order.
Buffered = tuple[float, State, State]


@dataclass(frozen=True)
class VersionInputs:
    """What a rule may read to make `event.version`: the current version and the buffer, read on demand."""

    config: RunConfig
    event: NewVersion
    current: State  # version event.version - 1
    version_of: Callable[[int], State]  # a published version's weights
    local_of: Callable[[Trip], State]  # a folded (or remembered) update's trained weights
    buffer: Callable[[], Iterator[Buffered]]  # the folded updates, read a few at a time
    server_state_of: Callable[[int], bytes | None]  # what the rule recorded with a version (None: nothing)
    run_id: str
    cache: WorkerCache  # this process's: a rule keeps its slow setup there (`run_object`)

    def run_object(self, name: str, build: Callable[[], T]) -> T:
        """An object kept for the run in this process, built once by `build`."""
        return self.cache.run_object(self.run_id, name, build)


@dataclass(frozen=True)
class MadeVersion:
    state: dict[str, torch.Tensor]
    server_state: bytes | None = None  # kept with the version; the next version's rule reads it back


class VersionRule(Protocol):
    # The strategy's mode: a fold pass refuses a run of another mode.
    mode: Mode

    def schedule(self, config: RunConfig, rules: Rules) -> Rules:
        """The schedule's rules as this strategy runs it, from those the config gives (`rules`): its buffer,
        its staleness weight, the folded updates each arrival remembers (`keep_recent`: their models are
        kept while a version may read them)."""

    def make(self, inputs: VersionInputs) -> MadeVersion:
        """The new version's weights (and any state the server records with it)."""


class BufferedFold:
    """FedBuff: current + global_lr * sum_i w_i (local_i - base_i) / n (fedqueue.fl.ml.aggregate.fold_buffer)."""

    def __init__(self, mode: Mode) -> None:
        self.mode = mode

    def schedule(self, config: RunConfig, rules: Rules) -> Rules:
        return rules

    def make(self, inputs: VersionInputs) -> MadeVersion:
        # torch: loaded by the worker that folds, not by the command line
        from fedqueue.fl.ml.aggregate import fold_buffer

        return MadeVersion(fold_buffer(inputs.current, inputs.buffer(), inputs.config.global_lr))


BUFFERED = BufferedFold(FEDBUFF)
