"""FedAsync, as callers outside fl/strategy/ see it."""

from fedqueue.fl.strategy.fedasync.section import FedAsyncSection
from fedqueue.fl.strategy.mode import VERSIONS, Mode

FEDASYNC = Mode(
    name="fedasync",
    unit=VERSIONS,
    bound="max_model_version",
    asynchronous=True,
    section=FedAsyncSection,
    # A version per update, weighed by FedAsync's own staleness function and mixed in by its own share.
    fixes=(("buffer_size", 1), ("staleness_weight", "none"), ("global_lr", 1.0)),
)
