"""FedBuff and FedRevive, as callers outside fl/strategy/ see them."""

from fedqueue.fl.strategy.fedbuff.section import FedBuffSection
from fedqueue.fl.strategy.fedrevive.section import FedReviveSection
from fedqueue.fl.strategy.mode import VERSIONS, Mode

FEDBUFF = Mode(name="fedbuff", unit=VERSIONS, bound="max_model_version", asynchronous=True, section=FedBuffSection)
# FedRevive's section extends FedBuff's: its keys are FedBuff's and its own.
FEDREVIVE = Mode(
    name="fedrevive",
    unit=VERSIONS,
    bound="max_model_version",
    asynchronous=True,
    distills=True,
    section=FedReviveSection,
)
