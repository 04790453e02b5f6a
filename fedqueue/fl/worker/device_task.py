"""What a worker does with one device task: load, train, upload, record. No Celery here."""

from __future__ import annotations

import functools
import logging
import time
from typing import TYPE_CHECKING

from fedqueue.core.codec import BlobRef
from fedqueue.core.services import Services
from fedqueue.errors import BlobIntegrityError
from fedqueue.fl.config import RunConfig
from fedqueue.fl.messages import DeviceTask, pack_sum_key, update_key
from fedqueue.fl.ml.seeding import task_seed
from fedqueue.fl.store.results import DeviceResult, record_device_result, record_device_results, unstored_devices
from fedqueue.fl.worker.cache import WorkerCache
from fedqueue.fl.worker.state_blobs import put_state, put_states
from fedqueue.fl.worker.timing_rows import task_timing
from fedqueue.store.repo import TaskTiming

if TYPE_CHECKING:
    import torch
    from torch import nn

    from fedqueue.fl.ml.pack_train import StackedPack
    from fedqueue.fl.ml.plugins import TensorData
    from fedqueue.fl.ml.train import LocalTrainConfig, TrainOutcome
    from fedqueue.fl.setup import Plugins
    from fedqueue.fl.strategy.base import Strategy
log = logging.getLogger(__name__)


def run_device_task(
    services: Services, cache: WorkerCache, task: DeviceTask, worker: str, attempt: int, strategy: Strategy
) -> int:
    """Train the task's devices that have no stored result, and store each once; returns how many it stored.

    `attempt` numbers this delivery (1 for the first), as counted by `Services.start_attempt`; `strategy`
    is the run's, told of what was stored.
    A pack delivered again (its worker died, or an attempt failed) skips the devices stored before.
    """
    # torch: loaded by a worker's first device task; the command line loads this module too
    from fedqueue.fl.ml.data import device_data, load_federated
    from fedqueue.fl.ml.models import build_model
    from fedqueue.fl.ml.torch_device import torch_device
    from fedqueue.fl.setup import data_spec, resolve_plugins, train_config

    started_at = time.time()
    clock = time.perf_counter()
    config = cache.run_config(services, task.run_id)
    # A first delivery finds nothing stored (the store drops a duplicate anyway): it skips the query.
    waiting = list(task.devices)
    if attempt > 1:
        waiting = unstored_devices(services.store, task.run_id, task.round_index, task.devices)
    if not waiting:
        log.info("%s: already stored; skipped", task.label)
        return 0
    try:
        global_state = cache.global_state(services, task.model)
    except BlobIntegrityError:
        # A late duplicate finds its round aggregated and the model deleted: nothing to do.
        # Duplicates that still find the model train, and the store keeps the first result.
        if not unstored_devices(services.store, task.run_id, task.round_index, task.devices):
            log.info("%s: already stored; skipped", task.label)
            return 0
        # A buffered-async run that ended with devices still queued unpublished its versions.
        if services.store.get_run(task.run_id).state != "running":
            log.info("%s: its run has ended; skipped", task.label)
            return 0
        raise
    spec = data_spec(config)
    federated = load_federated(spec)
    build = functools.partial(build_model, config.model, federated.input_shape, federated.num_classes, config.plugin)
    with cache.module(task.run_id, build) as model:
        delivery = _Delivery(
            services=services,
            cache=cache,
            task=task,
            worker=worker,
            attempt=attempt,
            config=config,
            model=model,
            global_state=global_state,
            plugins=resolve_plugins(config),
            train=train_config(config),
            torch_device=torch_device(),
            strategy=strategy,
        )
        if task.mode == "vmap" and len(waiting) > 1:
            datas = [device_data(spec, device) for device in waiting]
            return delivery.train_together(waiting, datas, started_at, _elapsed_ms(clock))
        stored = 0
        for device in waiting:
            stored += delivery.train_alone(device, device_data(spec, device), started_at, _elapsed_ms(clock))
            started_at, clock = time.time(), time.perf_counter()
        return stored


class _Delivery:
    """One delivery of a device task: what it trains with (on `torch_device`), and how each device's result is stored."""

    def __init__(
        self,
        *,
        services: Services,
        cache: WorkerCache,
        task: DeviceTask,
        worker: str,
        attempt: int,
        config: RunConfig,
        model: nn.Module,
        global_state: dict[str, torch.Tensor],
        plugins: Plugins,
        train: LocalTrainConfig,
        torch_device: torch.device,
        strategy: Strategy,
    ) -> None:
        self.services, self.cache, self.task, self.worker, self.attempt = services, cache, task, worker, attempt
        self.config, self.model, self.global_state = config, model, global_state
        self.plugins, self.train, self.torch_device, self.strategy = plugins, train, torch_device, strategy

    def train_alone(self, device: int, data: TensorData, started_at: float, load_ms: float) -> int:
        """Train one device exactly as a task of its own would, and store it."""
        # torch, as in run_device_task
        from fedqueue.fl.ml.train import train_local

        # The same module serves the pack's devices: loading the weights resets it completely.
        self.model.load_state_dict(self.global_state)
        clock = time.perf_counter()
        seed = task_seed(self.config.seed, self.task.round_index, device)
        # Its weights are written out before the module trains again: no copy of them is needed.
        outcome = train_local(
            self.model,
            data,
            self.train,
            seed,
            self.torch_device,
            self.plugins.local_step,
            self.plugins.options,
            copy_out=False,
        )
        phases = {"load_ms": load_ms, "compute_ms": _elapsed_ms(clock)}
        clock = time.perf_counter()
        ref = self._upload(device, outcome)
        timing = self._timing(device, started_at, upload_ms=_elapsed_ms(clock), **phases)
        return self._record([(self._result(device, outcome.samples, outcome.loss, ref), timing)])

    def train_together(self, devices: list[int], datas: list[TensorData], started_at: float, load_ms: float) -> int:
        """Train the devices in one vmapped computation; their timing rows are the pack's, shared."""
        # torch, as in run_device_task
        from fedqueue.fl.ml.aggregate import SUMMABLE_RULES
        from fedqueue.fl.ml.pack_train import train_pack

        self.model.load_state_dict(self.global_state)
        clock = time.perf_counter()
        seeds = [task_seed(self.config.seed, self.task.round_index, device) for device in devices]
        pack = train_pack(
            self.model, datas, self.train, seeds, self.torch_device, self.plugins.local_step, self.plugins.options
        )
        phases = {"load_ms": load_ms, "compute_ms": _elapsed_ms(clock)}
        task = self.task
        waiting = set(devices)
        if self.config.plugin_names()["aggregate"] in SUMMABLE_RULES and self.strategy.presums_packs:
            stored = self._store_summed(devices, pack, started_at, phases)
            if stored is not None:
                return stored
            # Another delivery stored a device of the pack first: the sum counts for none; the rest go alone.
            waiting = set(unstored_devices(self.services.store, task.run_id, task.round_index, devices))
        # One Redis round trip for the pack's updates and one transaction for its rows.
        clock = time.perf_counter()
        kept = [(member, device) for member, device in enumerate(devices) if device in waiting]
        outcomes = pack.outcomes()
        states = [
            (update_key(task.run_id, task.round_index, device), outcomes[member].state) for member, device in kept
        ]
        refs = put_states(self.services.blobs, states)
        phases["upload_ms"] = _elapsed_ms(clock)
        finished_at = time.time()
        return self._record(
            [
                (
                    self._result(device, pack.samples[member], pack.losses[member], ref),
                    self._timing(device, started_at, finished_at=finished_at, **phases),
                )
                for (member, device), ref in zip(kept, refs, strict=True)
            ]
        )

    def _store_summed(
        self, devices: list[int], pack: StackedPack, started_at: float, phases: dict[str, float]
    ) -> int | None:
        """FedAvg needs only the pack's sum: one blob for all its devices (summed where they trained).

        Stored for all the devices or for none (None), since the sum cannot be taken apart.
        """
        clock = time.perf_counter()
        key = pack_sum_key(self.task.run_id, self.task.round_index, devices)
        ref = put_state(self.services.blobs, key, pack.weighted_delta_sum())
        timing = {**phases, "upload_ms": _elapsed_ms(clock), "finished_at": time.time()}
        rows = [
            (self._result(device, samples, loss, ref), self._timing(device, started_at, **timing))
            for device, samples, loss in zip(devices, pack.samples, pack.losses, strict=True)
        ]
        return self._record(rows, all_or_nothing=True) or None

    def _upload(self, device: int, outcome: TrainOutcome) -> BlobRef:
        task = self.task
        return put_state(self.services.blobs, update_key(task.run_id, task.round_index, device), outcome.state)

    def _timing(self, device: int, started_at: float, **phases: float) -> TaskTiming:
        # torch, as in run_device_task
        from fedqueue.fl.ml.torch_device import device_label

        return task_timing(self.task, device, "done", self.worker, self.attempt, device_label(), started_at, **phases)

    def _result(self, device: int, samples: int, loss: float, ref: BlobRef) -> DeviceResult:
        task = self.task
        return DeviceResult(
            run_id=task.run_id,
            round_index=task.round_index,
            device=device,
            state="done",
            worker=self.worker,
            attempt=self.attempt,
            samples=samples,
            loss=loss,
            update_key=ref.key,
            update_sha256=ref.sha256,
            update_nbytes=ref.nbytes,
        )

    def _record(self, rows: list[tuple[DeviceResult, TaskTiming]], all_or_nothing: bool = False) -> int:
        """Store the devices' results in one transaction; returns how many this delivery's results count for.

        `all_or_nothing`: rows sharing one summed update are stored together or not at all.
        """
        counts = record_device_results(self.services.store, rows, all_or_nothing)
        dropped = [result.update_key for (result, _), count in zip(rows, counts, strict=True) if count is None]
        if dropped:
            # Other deliveries of these devices stored first; their updates are the ones that count.
            self.services.blobs.delete(list(dict.fromkeys(key for key in dropped if key)))
            log.info("%s: %d duplicate devices dropped", self.task.label, len(dropped))
        stored = [count for count in counts if count is not None]
        if stored:
            self.strategy.on_stored(self.services, self.task, max(stored), self.worker, self.cache)
        return len(stored)


def give_up_on(
    services: Services,
    task: DeviceTask,
    worker: str,
    attempts: int,
    error: str,
    strategy: Strategy,
    device_used: str = "-",
) -> None:
    """A task that failed every attempt: a pack's devices are tried again one by one, a lone device is stored failed.

    So a poisoned device fails alone, and its pack-mates are stored.
    """
    if len(task.devices) == 1:
        record_failure(services, task, worker, attempts, error, strategy, device_used)
        return
    waiting = unstored_devices(services.store, task.run_id, task.round_index, task.devices)
    log.warning("%s failed %d attempts; its %d unstored devices go on alone", task.label, attempts, len(waiting))
    now = time.time()
    services.enqueue([task.alone(device, now) for device in waiting])


def record_failure(
    services: Services,
    task: DeviceTask,
    worker: str,
    attempts: int,
    error: str,
    strategy: Strategy,
    device_used: str = "-",
) -> None:
    """Store a lone device that failed every attempt, so its round can still close."""
    (device,) = task.devices
    result = DeviceResult(
        run_id=task.run_id,
        round_index=task.round_index,
        device=device,
        state="failed",
        worker=worker,
        attempt=attempts,
        error=error[-4000:],
    )
    timing = task_timing(task, device, "failed", worker, attempts, device_used, time.time(), error=result.error)
    stored = record_device_result(services.store, result, timing)
    if stored is not None:
        strategy.on_stored(services, task, stored, worker)


def _elapsed_ms(start: float) -> float:
    return (time.perf_counter() - start) * 1000
