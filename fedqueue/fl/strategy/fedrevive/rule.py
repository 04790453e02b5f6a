"""FedRevive's version rule: each folded update mixed with a distilled one, then folded as FedBuff folds.

The schedule remembers the last `kd_buffer_size` folded updates with each arrival: their local models are the
teachers its distillation reads, kept by the fold pass while a version may still need them.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from fedqueue.fl.strategy.fedbuff.rule import MadeVersion, VersionInputs
from fedqueue.fl.strategy.fedrevive.mode import FEDREVIVE
from fedqueue.fl.strategy.fedrevive.section import FedReviveSection

if TYPE_CHECKING:
    from fedqueue.fl.config import RunConfig
    from fedqueue.fl.strategy.fedbuff.schedule import Rules
    from fedqueue.fl.strategy.mode import Mode


class ReviveFold:
    def __init__(self, mode: Mode) -> None:
        self.mode = mode

    def schedule(self, config: RunConfig, rules: Rules) -> Rules:
        return replace(rules, keep_recent=config.strategy(FedReviveSection).kd_buffer_size)

    def make(self, inputs: VersionInputs) -> MadeVersion:
        # torch: FedRevive's distillation, loaded by a FedRevive run's fold pass only
        from fedqueue.fl.ml.aggregate import fold_deltas
        from fedqueue.fl.strategy.fedrevive.revive import Reviver

        config = inputs.config
        reviver = inputs.run_object("reviver", lambda: Reviver(config))
        deltas = reviver.deltas(inputs.event, inputs.version_of, inputs.local_of, inputs.server_state_of)
        state = fold_deltas(inputs.current, deltas, config.global_lr)
        # The data-free synthesizer's state after this version: the next version's pass continues from it.
        return MadeVersion(state, reviver.server_state(inputs.event.version))


REVIVE = ReviveFold(FEDREVIVE)
