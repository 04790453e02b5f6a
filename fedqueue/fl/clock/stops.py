"""Why a run ends: its bound on versions, FedRevive's stop rules, and the one line that names the rule.

FedRevive's simulator checks its stops after every event; here each strategy checks them where it
knows what they read. Simulated time (`max_sim_time`, their `max_wait_time`): an update that would
arrive at or after the limit is never taken, so the last version is the last one made before it.
Accuracy (`target_accuracy`, `early_stop`): read after a version is made and evaluated;
`target_accuracy` compares the most recent evaluation, `early_stop` the best one so far.

Pure (no torch, no store): the schedule, the fold pass and the synchronous aggregator share it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from fedqueue.errors import ConfigError

# The rules a stop may name: a bound on versions (`rounds`, `max_model_version` or its alias `max_rounds`),
# simulated time, or accuracy.
RULES = ("rounds", "max_rounds", "max_model_version", "max_sim_time", "target_accuracy", "early_stop")
ACCURACY_RULES = ("target_accuracy", "early_stop")


@dataclass(frozen=True)
class Stop:
    """The rule that ended a run, at which version and simulated time, in one line."""

    rule: str
    reason: str
    version: int
    sim_time: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"rule": self.rule, "reason": self.reason, "version": self.version, "sim_time": self.sim_time}

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> Stop:
        sim_time = raw.get("sim_time")
        return cls(
            str(raw["rule"]), str(raw["reason"]), int(raw["version"]), None if sim_time is None else float(sim_time)
        )


@dataclass(frozen=True)
class StopRules:
    """A run's stops, read from its config (`RunConfig.stop_rules`)."""

    last_version: int | None = None  # None: a buffered run bounded by simulated time alone
    bound: str = "max_model_version"  # the knob that set last_version, named by its stop
    max_sim_time: float | None = None
    target_accuracy: float | None = None
    early_stop: tuple[tuple[int, float], ...] = ()

    @property
    def reads_accuracy(self) -> bool:
        return self.target_accuracy is not None or bool(self.early_stop)


def version_stop(rules: StopRules, version: int, sim_time: float | None) -> Stop | None:
    """The bound on versions: version `last_version` is the last."""
    if rules.last_version is None or version < rules.last_version:
        return None
    return Stop(
        rules.bound,
        f"stopped: {_unit(rules)} {version} reached ({rules.bound} = {rules.last_version})",
        version,
        sim_time,
    )


def time_stop(rules: StopRules, version: int, last_at: float | None, next_at: float | None) -> Stop | None:
    """Simulated time: the next update at `next_at` (None: known to come at or after the limit, as a
    synchronous run's next round) is past the limit, so `version`, made at `last_at`, is the last."""
    if rules.max_sim_time is None or (next_at is not None and next_at < rules.max_sim_time):
        return None
    made = "" if last_at is None else f" at {last_at:.1f}"
    then = "after the limit" if next_at is None else f"at {next_at:.1f}"
    return Stop(
        "max_sim_time",
        f"stopped: simulated time {_number(rules.max_sim_time)} reached (max_sim_time = {_number(rules.max_sim_time)});"
        f" {_unit(rules)} {version} made{made}, the next would come {then}",
        version,
        last_at,
    )


def accuracy_stop(
    rules: StopRules, version: int, sim_time: float | None, last: float | None, best: float | None
) -> Stop | None:
    """After version `version`: `last` is the most recent evaluation's accuracy, `best` the highest so far
    (None before any). FedRevive's order: target first, then each early_stop entry in turn."""
    if rules.target_accuracy is not None and last is not None and last >= rules.target_accuracy:
        return Stop(
            "target_accuracy",
            f"stopped: accuracy {last:.4f} at version {version} reached target_accuracy = {rules.target_accuracy}",
            version,
            sim_time,
        )
    for at, floor in rules.early_stop:
        if version >= at and best is not None and best <= floor:
            return Stop(
                "early_stop",
                f"stopped: best accuracy {best:.4f} by version {version} is at most {floor}"
                f" (early_stop: version = {at}, accuracy = {floor})",
                version,
                sim_time,
            )
    return None


def check_stop_rules(
    max_sim_time: float | None,
    target_accuracy: float | None,
    early_stop: list[dict[str, Any]],
    eval_every: int,
    max_rounds: int | None,
) -> None:
    """The stop knobs' values; one line naming the field at fault."""
    if max_sim_time is not None and not (math.isfinite(max_sim_time) and max_sim_time > 0):
        raise ConfigError(f"max_sim_time: simulated seconds greater than 0, got {max_sim_time}")
    if target_accuracy is not None and not 0 < target_accuracy <= 1:
        raise ConfigError(f"target_accuracy: an accuracy in (0, 1], got {target_accuracy}")
    if max_rounds is not None and max_rounds <= 0:
        raise ConfigError(f"max_rounds: must be a positive integer, got {max_rounds}")
    for item in early_stop:
        if not isinstance(item, dict) or set(item) != {"version", "accuracy"}:
            raise ConfigError(f"early_stop: each entry is {{version = N, accuracy = A}}, got {item!r}")
        version, accuracy = item["version"], item["accuracy"]
        if isinstance(version, bool) or not isinstance(version, int) or version <= 0:
            raise ConfigError(f"early_stop: version must be a positive integer, got {version!r}")
        if isinstance(accuracy, bool) or not isinstance(accuracy, int | float) or not 0 <= accuracy <= 1:
            raise ConfigError(f"early_stop: accuracy must be a number in [0, 1], got {accuracy!r}")
        # The rule reads evaluations: at a version never evaluated it would read an older one.
        if version % eval_every != 0:
            raise ConfigError(
                f"early_stop: version {version} is not evaluated (eval_every = {eval_every}); use a multiple of it"
            )


def _number(value: float) -> str:
    return f"{value:g}"


def _unit(rules: StopRules) -> str:
    """What the run's count is of: a synchronous run's rounds, a buffered run's versions."""
    return "round" if rules.bound == "rounds" else "version"
