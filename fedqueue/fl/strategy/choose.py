"""Which strategy runs a config: the one place that knows both."""

from __future__ import annotations

from fedqueue.fl.config import RunConfig
from fedqueue.fl.strategy.base import Strategy
from fedqueue.fl.strategy.fedbuff.strategy import FEDBUFF
from fedqueue.fl.strategy.sync.strategy import SYNCHRONOUS


def strategy_for(config: RunConfig) -> Strategy:
    """The strategy that runs a config's `mode`."""
    return FEDBUFF if config.is_buffered else SYNCHRONOUS
