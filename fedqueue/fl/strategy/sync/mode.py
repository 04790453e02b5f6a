"""Synchronous FedAvg, as callers outside fl/strategy/ see it."""

from fedqueue.fl.strategy.mode import ROUNDS, Mode

FEDAVG = Mode(name="fedavg", unit=ROUNDS, bound="rounds", asynchronous=False, takes_aggregate=True)
