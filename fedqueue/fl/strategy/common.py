"""What both strategies share: claims renewed while a version is made, evaluation of a version, checkpoints."""

from __future__ import annotations

import contextlib
import hashlib
import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from fedqueue.core.services import Services
from fedqueue.fl.config import RunConfig
from fedqueue.fl.ml.weights import decode_state
from fedqueue.fl.store.results import load_checkpoint, save_checkpoint
from fedqueue.store import Store

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)


class ClaimLost(Exception):
    """Another aggregator took the round over: this one stops without writing."""


@contextlib.contextmanager
def renewing(services: Services, renew: Callable[[], bool], what: str) -> Iterator[threading.Event]:
    """Renew a claim every third of its lifetime while the block runs; the event is set if it was lost.

    `renew()` returns False once another holder took the claim over.
    """
    stop, lost = threading.Event(), threading.Event()

    def keep() -> None:
        while not stop.wait(services.settings.heartbeat_ttl_s / 3):
            try:
                if not renew():
                    lost.set()
                    return
            except Exception as err:  # a blip: the claim lives a full period, the next renewal may pass
                log.warning("%s: claim not renewed (%s)", what, err)

    thread = threading.Thread(target=keep, name="fedqueue-claim", daemon=True)
    thread.start()
    try:
        yield lost
    finally:
        stop.set()
        thread.join()


def evaluate_version(
    config: RunConfig, version: int, state: Mapping[str, torch.Tensor], last: bool = False
) -> dict[str, Any]:
    """Held-out accuracy and loss of a version (overall, and per class as `label_wise`), every `eval_every`
    versions and at the last (`last`: known to be the last by a stop rule); else nothing."""
    # torch: loaded where a version is evaluated, not by every process that loads the strategies
    from fedqueue.fl.ml.data import load_federated
    from fedqueue.fl.ml.evaluate import evaluate_by_class
    from fedqueue.fl.ml.models import build_model
    from fedqueue.fl.ml.torch_device import torch_device
    from fedqueue.fl.setup import data_spec

    if version % config.eval_every != 0 and version != config.last_version and not last:
        return {}
    began = time.perf_counter()
    data = load_federated(data_spec(config))
    device = torch_device()
    model = build_model(config.model, data.input_shape, data.num_classes, config.plugin)
    model.load_state_dict(state)
    result = evaluate_by_class(model.to(device), data.test, device, data.num_classes)
    return {
        "accuracy": result.accuracy,
        "loss": result.loss,
        "label_wise": result.label_wise(),
        "eval_ms": (time.perf_counter() - began) * 1000,
    }


def checkpoint_version(
    services: Services, run_id: str, version: int, encoded: bytes | memoryview, sha256: str | None = None
) -> None:
    """The run's checkpoint; `sha256`: the encoding's, where the caller has it already (not hashed again)."""
    digest = sha256 if sha256 is not None else hashlib.sha256(encoded).hexdigest()
    save_checkpoint(services.store, run_id, version, digest, encoded)


def final_state(store: Store, run_id: str) -> dict[str, torch.Tensor]:
    """The latest checkpointed global weights of a run."""
    checkpoint = load_checkpoint(store, run_id)
    if checkpoint is None:
        raise LookupError(f"run {run_id} has no checkpoint")
    return decode_state(checkpoint.data)


def checkpoint_bytes(services: Services, run_id: str, version: int) -> bytes:
    checkpoint = load_checkpoint(services.store, run_id)
    if checkpoint is None or checkpoint.version != version:
        found = None if checkpoint is None else checkpoint.version
        raise RuntimeError(f"run {run_id}: checkpoint of version {version} needed, store has {found}")
    return bytes(checkpoint.data)
