"""Aggregation strategies behind one small protocol (base.py): synchronous FedAvg, buffered async FedBuff."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fedqueue.fl.config import RunConfig
    from fedqueue.fl.strategy.base import Strategy


def strategy_for(config: RunConfig) -> Strategy:
    """The strategy that runs a config's `mode` (imported when asked: each pulls in its own orchestration)."""
    if config.is_buffered:
        from fedqueue.fl.strategy.buffered import FEDBUFF

        return FEDBUFF
    from fedqueue.fl.strategy.synchronous import SYNCHRONOUS

    return SYNCHRONOUS
