"""Synchronous FedAvg, as callers outside fl/strategy/ see it."""

from fedqueue.fl.strategy.mode import ROUNDS, Mode
from fedqueue.fl.strategy.sync.section import FedAvgSection

FEDAVG = Mode(
    name="fedavg", unit=ROUNDS, bound="rounds", asynchronous=False, takes_aggregate=True, section=FedAvgSection
)
