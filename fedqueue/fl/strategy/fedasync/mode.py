"""FedAsync, as callers outside fl/strategy/ see it."""

from fedqueue.fl.strategy.fedasync.section import FedAsyncSection
from fedqueue.fl.strategy.mode import VERSIONS, Mode

# Its section extends FedBuff's with a buffer of one: a version per update.
FEDASYNC = Mode(name="fedasync", unit=VERSIONS, bound="max_model_version", asynchronous=True, section=FedAsyncSection)
