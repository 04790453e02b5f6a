"""Every strategy by the `mode` that names it: the one place that knows them all.

The kind, the scheduler and the commands ask a run's entry here; the config and the views, which must not load
a strategy, ask its `Mode` in modes.py.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fedqueue.fl.strategy.base import Entry, Strategy
from fedqueue.fl.strategy.fedbuff.strategy import ENTRY as FEDBUFF
from fedqueue.fl.strategy.fedbuff.strategy import REVIVE_ENTRY as FEDREVIVE
from fedqueue.fl.strategy.sync.strategy import ENTRY as FEDAVG

if TYPE_CHECKING:
    from fedqueue.core.jobs import TaskHandler
    from fedqueue.fl.config import RunConfig

REGISTRY: dict[str, Entry] = {entry.mode.name: entry for entry in (FEDAVG, FEDBUFF, FEDREVIVE)}


def entry_for(config: RunConfig) -> Entry:
    return REGISTRY[config.mode]


def strategy_for(config: RunConfig) -> Strategy:
    """The strategy that runs a config's `mode`."""
    return entry_for(config).strategy


def control_handlers() -> tuple[TaskHandler, ...]:
    """The control tasks of every strategy, each once (FedBuff and FedRevive share the fold pass)."""
    found: dict[str, TaskHandler] = {}
    for entry in REGISTRY.values():
        for handler in entry.control:
            found.setdefault(handler.name, handler)
    return tuple(found.values())
