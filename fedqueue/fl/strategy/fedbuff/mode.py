"""FedBuff, as callers outside fl/strategy/ see it."""

from fedqueue.fl.strategy.fedbuff.section import FedBuffSection
from fedqueue.fl.strategy.mode import VERSIONS, Mode

FEDBUFF = Mode(name="fedbuff", unit=VERSIONS, bound="max_model_version", asynchronous=True, section=FedBuffSection)
