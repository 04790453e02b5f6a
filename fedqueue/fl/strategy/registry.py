"""Every strategy by the `mode` that names it: the one place that knows them all.

The kind, the scheduler and the commands ask a run's entry here; the config and the views, which must not load
a strategy, ask its `Mode` in modes.py.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

from fedqueue.fl.strategy.base import Entry, Strategy
from fedqueue.fl.strategy.fedasync.strategy import ENTRY as FEDASYNC
from fedqueue.fl.strategy.fedbuff.strategy import ENTRY as FEDBUFF
from fedqueue.fl.strategy.fedbuff.strategy import BufferedAsync
from fedqueue.fl.strategy.fedrevive.strategy import ENTRY as FEDREVIVE
from fedqueue.fl.strategy.sync.strategy import ENTRY as FEDAVG

if TYPE_CHECKING:
    from fedqueue.core.jobs import TaskContext, TaskHandler
    from fedqueue.fl.config import RunConfig
    from fedqueue.fl.strategy.fedbuff.schedule import Rules

REGISTRY: dict[str, Entry] = {entry.mode.name: entry for entry in (FEDAVG, FEDBUFF, FEDREVIVE, FEDASYNC)}


def entry_for(config: RunConfig) -> Entry:
    return REGISTRY[config.mode]


def strategy_for(config: RunConfig) -> Strategy:
    """The strategy that runs a config's `mode`."""
    return entry_for(config).strategy


def rules_of(config: RunConfig) -> Rules:
    """The schedule's rules of a buffered run (its strategy's version rule's included): a schedule rebuilt from
    a config alone, as tests and benchmarks do, is the one its fold passes run."""
    strategy = strategy_for(config)
    if not isinstance(strategy, BufferedAsync):
        raise ValueError(f"mode = {config.mode!r} makes no versions on a schedule")
    return strategy.rules(config)


def control_handlers() -> tuple[TaskHandler, ...]:
    """The control tasks of every strategy, each name once: strategies that share a task (FedBuff, FedRevive
    and FedAsync share the fold pass) each handle the messages of their own runs."""
    found: dict[str, dict[str, TaskHandler]] = {}
    for name, entry in REGISTRY.items():
        for handler in entry.control:
            found.setdefault(handler.name, {})[name] = handler
    return tuple(_per_run(by_mode) for by_mode in found.values())


def _per_run(by_mode: dict[str, TaskHandler]) -> TaskHandler:
    """One handler for a task several strategies send: each message goes to the handler of its run's mode."""
    first = next(iter(by_mode.values()))
    if len({id(handler) for handler in by_mode.values()}) == 1:
        return first
    assert all(h.message_type is first.message_type and h.queue == first.queue for h in by_mode.values())
    assert all(h.refusal is None for h in by_mode.values()), "a shared task's refusal would not know the run"

    def own(context: TaskContext, task: Any) -> TaskHandler:
        return by_mode[context.cache.run_config(context.services, task.run_id).mode]

    def run(context: TaskContext, task: Any) -> None:
        own(context, task).run(context, task)

    def give_up(context: TaskContext, task: Any, attempts: int, error: str) -> None:
        own(context, task).give_up(context, task, attempts, error)

    return replace(first, run=run, give_up=give_up)
