"""FedRevive, as callers outside fl/strategy/ see it."""

from fedqueue.fl.strategy.mode import VERSIONS, Mode

FEDREVIVE = Mode(name="fedrevive", unit=VERSIONS, bound="max_model_version", asynchronous=True, distills=True)
