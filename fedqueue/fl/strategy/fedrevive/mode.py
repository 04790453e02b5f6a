"""FedRevive, as callers outside fl/strategy/ see it."""

from fedqueue.fl.strategy.fedrevive.section import FedReviveSection
from fedqueue.fl.strategy.mode import VERSIONS, Mode

# Its section extends FedBuff's: its keys are FedBuff's and its own.
FEDREVIVE = Mode(
    name="fedrevive",
    unit=VERSIONS,
    bound="max_model_version",
    asynchronous=True,
    distills=True,
    section=FedReviveSection,
)
