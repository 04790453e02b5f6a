"""FedAsync's version rule: the one update of each version mixed into the current version.

x_t = (1 - alpha_t) x_{t-1} + alpha_t x_new, alpha_t = alpha * s(t - tau): x_new is the device's model trained from
version tau, s FedAsync's staleness function (section.py), which the schedule records as the update's weight.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING

from fedqueue.fl.strategy.fedasync.mode import FEDASYNC
from fedqueue.fl.strategy.fedasync.section import FedAsyncSection
from fedqueue.fl.strategy.fedbuff.rule import MadeVersion, VersionInputs

if TYPE_CHECKING:
    import torch

    from fedqueue.fl.config import RunConfig
    from fedqueue.fl.strategy.fedbuff.schedule import Rules
    from fedqueue.fl.strategy.mode import Mode


def mix(
    current: Mapping[str, torch.Tensor], local: Mapping[str, torch.Tensor], share: float
) -> dict[str, torch.Tensor]:
    """current + share * (local - current), in float64; non-floating tensors (counters) kept from `current`."""
    # torch: loaded by the worker that folds, not by the command line
    from fedqueue.fl.ml.aggregate import fold_buffer

    # One update of weight `share` trained from `current`, a step of 1: no float64 copy of the change.
    return fold_buffer(current, [(share, current, local)], 1.0)


class MixFold:
    def __init__(self, mode: Mode) -> None:
        self.mode = mode

    def schedule(self, config: RunConfig, rules: Rules) -> Rules:
        return replace(rules, weigh=config.strategy(FedAsyncSection).weight)

    def make(self, inputs: VersionInputs) -> MadeVersion:
        (arrival,) = inputs.event.folded
        share = inputs.config.strategy(FedAsyncSection).fedasync_alpha * arrival.weight
        return MadeVersion(mix(inputs.current, inputs.local_of(arrival.trip), share))


MIX = MixFold(FEDASYNC)
