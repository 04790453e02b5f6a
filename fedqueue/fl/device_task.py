"""What a worker does with one device task: load, train, upload, record. No Celery here."""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from typing import TYPE_CHECKING

from fedqueue.core.codec import BlobRef
from fedqueue.core.services import Services
from fedqueue.errors import BlobIntegrityError
from fedqueue.fl.config import RunConfig
from fedqueue.fl.messages import DeviceTask
from fedqueue.fl.rounds import request_aggregation, update_key
from fedqueue.fl.timing import task_timing
from fedqueue.fl.weights import decode_state, encode_state
from fedqueue.store.repo import DeviceResult

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)


class WorkerCache:
    """Per-process caches: run configs and global models by version, never fetched twice."""

    def __init__(self, max_models: int = 4) -> None:
        self._lock = threading.Lock()
        self._configs: dict[str, RunConfig] = {}
        self._models: OrderedDict[str, dict[str, torch.Tensor]] = OrderedDict()
        self._max_models = max_models

    def run_config(self, services: Services, run_id: str) -> RunConfig:
        with self._lock:
            config = self._configs.get(run_id)
        if config is None:
            config = RunConfig.from_dict(services.store.get_run(run_id).config)
            with self._lock:
                self._configs[run_id] = config
        return config

    def global_state(self, services: Services, ref: BlobRef) -> dict[str, torch.Tensor]:
        # Keyed by sha256 as well, so a re-published version can never be served stale.
        cache_key = f"{ref.key}@{ref.sha256}"
        with self._lock:
            state = self._models.get(cache_key)
            if state is not None:
                self._models.move_to_end(cache_key)
                return state
        state = decode_state(services.blobs.get(ref))
        with self._lock:
            self._models[cache_key] = state
            while len(self._models) > self._max_models:
                self._models.popitem(last=False)
        return state


def run_device_task(services: Services, cache: WorkerCache, task: DeviceTask, worker: str, attempt: int) -> bool:
    """Train one device and store its result once; True when this delivery stored it.

    `attempt` numbers this delivery (1 for the first), as counted by `Services.start_attempt`.
    """
    from fedqueue.fl.data import device_data, load_federated
    from fedqueue.fl.devices import device_label, torch_device
    from fedqueue.fl.experiment import data_spec, resolve_plugins, train_config
    from fedqueue.fl.models import build_model
    from fedqueue.fl.seeding import task_seed
    from fedqueue.fl.train import train_local

    started_at = time.time()
    clock = time.perf_counter()
    config = cache.run_config(services, task.run_id)
    try:
        global_state = cache.global_state(services, task.model)
    except BlobIntegrityError:
        # A late duplicate finds its round aggregated and the model deleted: nothing to do.
        # Duplicates that still find the model train, and the store keeps the first result.
        if services.store.has_result(task.run_id, task.round_index, task.device):
            log.info("run %s round %d device %d already stored; skipped", task.run_id, task.round_index, task.device)
            return False
        raise
    spec = data_spec(config)
    data = device_data(spec, task.device)
    federated = load_federated(spec)
    model = build_model(config.model, federated.input_shape, federated.num_classes, config.plugin)
    plugins = resolve_plugins(config)
    model.load_state_dict(global_state)
    load_ms = _elapsed_ms(clock)

    clock = time.perf_counter()
    seed = task_seed(config.seed, task.round_index, task.device)
    outcome = train_local(model, data, train_config(config), seed, torch_device(), plugins.local_step, plugins.options)
    train_ms = _elapsed_ms(clock)

    clock = time.perf_counter()
    ref = services.blobs.put(update_key(task.run_id, task.round_index, task.device), encode_state(outcome.state))
    upload_ms = _elapsed_ms(clock)

    result = DeviceResult(
        run_id=task.run_id,
        round_index=task.round_index,
        device=task.device,
        state="done",
        worker=worker,
        attempt=attempt,
        samples=outcome.samples,
        loss=outcome.loss,
        update_key=ref.key,
        update_sha256=ref.sha256,
        update_nbytes=ref.nbytes,
    )
    phases = {"load_ms": load_ms, "compute_ms": train_ms, "upload_ms": upload_ms}
    timing = task_timing(task, "done", worker, attempt, device_label(), started_at, **phases)
    stored = services.store.record_device_result(result, timing)
    if stored is None:
        # Another delivery of this task stored first; its update is the one that counts.
        services.blobs.delete([ref.key])
        log.info("duplicate of run %s round %d device %d dropped", task.run_id, task.round_index, task.device)
        return False
    _close_round_if_last(services, task, stored)
    return True


def record_failure(
    services: Services, task: DeviceTask, worker: str, attempts: int, error: str, device_used: str = "-"
) -> None:
    """Store a device that failed every attempt, so its round can still close."""
    result = DeviceResult(
        run_id=task.run_id,
        round_index=task.round_index,
        device=task.device,
        state="failed",
        worker=worker,
        attempt=attempts,
        error=error[-4000:],
    )
    timing = task_timing(task, "failed", worker, attempts, device_used, time.time(), error=result.error)
    stored = services.store.record_device_result(result, timing)
    if stored is not None:
        _close_round_if_last(services, task, stored)


def _close_round_if_last(services: Services, task: DeviceTask, stored: int) -> None:
    """The worker that stored a round's last result (`stored` counts them) enqueues its aggregation."""
    if stored >= task.round_size:
        request_aggregation(services, task.run_id, task.round_index)


def _elapsed_ms(start: float) -> float:
    return (time.perf_counter() - start) * 1000
