"""What callers outside fl/strategy/ may know of a strategy: a `Mode`, keyed by the config's `mode`.

A leaf (stdlib only), so the run config, the views and the worker can read it without loading a strategy.
Each strategy's folder defines its own (sync/mode.py, fedbuff/mode.py); modes.py lists them.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Unit:
    """What a run makes, in the words status, runs, bars, the report and TensorBoard use."""

    singular: str  # "round 3", "version 3"
    made: str  # "7 of 10 done", "7 of 10 made"
    short: str  # "7/10 r · t≤200"
    counted: str  # `fedqueue runs` after a count: "7/10 rounds", "312/500 v"


ROUNDS = Unit(singular="round", made="done", short="r", counted="rounds")
VERSIONS = Unit(singular="version", made="made", short="v", counted="v")


@dataclass(frozen=True)
class Mode:
    name: str
    unit: Unit
    # The config key that bounds its progress (beside max_rounds, the common name).
    bound: str
    # Versions made as updates arrive on the simulated clock, from a schedule: the views show its buffer, its
    # updates' staleness and the schedule's clock; a failed device was folded past, never retried into a version.
    asynchronous: bool
    # `aggregate` (FedAvg or a plugin) applies: a run is then named by its aggregation.
    takes_aggregate: bool = False
    # FedRevive's distillation: kd_* settings apply, and kd_split of the training set is held out.
    distills: bool = False
    # Its config section: a frozen dataclass of the flat keys only this strategy reads (fl/sections/base.py),
    # beside it in its folder; the config reader routes those keys to it. None: the mode has no keys of its own.
    section: type | None = None
