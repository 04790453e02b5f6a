"""FedBuff and FedRevive, as callers outside fl/strategy/ see them."""

from fedqueue.fl.strategy.mode import VERSIONS, Mode

FEDBUFF = Mode(name="fedbuff", unit=VERSIONS, bound="max_model_version", asynchronous=True)
FEDREVIVE = Mode(name="fedrevive", unit=VERSIONS, bound="max_model_version", asynchronous=True, distills=True)
