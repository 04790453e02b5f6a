"""What a worker does with one device task: load, train, upload, record. No Celery here."""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, TypeVar, cast

from fedqueue.core.codec import BlobRef
from fedqueue.core.keys import pack_sum_key, update_key
from fedqueue.core.services import Services
from fedqueue.errors import BlobIntegrityError
from fedqueue.fl.config import RunConfig
from fedqueue.fl.messages import DeviceTask
from fedqueue.fl.results import DeviceResult, record_device_result, record_device_results, unstored_devices
from fedqueue.fl.strategy import strategy_for
from fedqueue.fl.timing import task_timing
from fedqueue.fl.weights import decode_state, encode_state
from fedqueue.store.repo import TaskTiming

if TYPE_CHECKING:
    import torch
    from torch import nn

    from fedqueue.fl.data import TensorData
    from fedqueue.fl.experiment import Plugins
    from fedqueue.fl.pack_train import StackedPack
    from fedqueue.fl.train import LocalTrainConfig, TrainOutcome

T = TypeVar("T")
log = logging.getLogger(__name__)


# Global models a worker keeps: always the last MODELS_KEPT, and older ones while all fit in
# MODEL_BYTES_KEPT. A buffered-async version folds updates trained on several older versions, which
# a small model's worker then never reads back from Redis; a large model's keeps just the last few.
MODELS_KEPT = 4
MODEL_BYTES_KEPT = 64 * 2**20


def _state_bytes(state: dict[str, torch.Tensor]) -> int:
    return sum(tensor.numel() * tensor.element_size() for tensor in state.values())


class WorkerCache:
    """Per-process caches: run configs and global models by version, never fetched twice;
    the run's model modules, built once per slot."""

    def __init__(self, max_models: int = MODELS_KEPT, model_bytes: int = MODEL_BYTES_KEPT) -> None:
        self._lock = threading.Lock()
        self._configs: dict[str, RunConfig] = {}
        self._models: OrderedDict[str, tuple[dict[str, torch.Tensor], int]] = OrderedDict()  # state, its bytes
        self._model_bytes = 0
        self._max_model_bytes = model_bytes
        self._max_models = max_models
        self._idle_modules: OrderedDict[str, list[nn.Module]] = OrderedDict()  # by run, most recent last
        self._version_refs: OrderedDict[str, dict[int, BlobRef]] = OrderedDict()  # by run, most recent last
        self._run_objects: OrderedDict[tuple[str, str], Any] = OrderedDict()  # by (run, name), most recent last

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
            kept = self._models.get(cache_key)
            if kept is not None:
                self._models.move_to_end(cache_key)
                return kept[0]
        state = decode_state(services.blobs.get(ref))
        self.keep_global_state(ref, state)
        return state

    def keep_global_state(self, ref: BlobRef, state: dict[str, torch.Tensor]) -> None:
        """A version this process made itself: served from memory, never read back."""
        size = _state_bytes(state)
        with self._lock:
            earlier = self._models.pop(f"{ref.key}@{ref.sha256}", None)
            self._model_bytes += size - (earlier[1] if earlier is not None else 0)
            self._models[f"{ref.key}@{ref.sha256}"] = (state, size)
            while len(self._models) > self._max_models and self._model_bytes > self._max_model_bytes:
                self._model_bytes -= self._models.popitem(last=False)[1][1]

    def version_refs(self, run_id: str) -> dict[int, BlobRef]:
        """Where a buffered run's published versions are, by number: a version's bytes never change,
        so fold passes on this process look each one up once."""
        with self._lock:
            refs = self._version_refs.setdefault(run_id, {})
            self._version_refs.move_to_end(run_id)
            while len(self._version_refs) > self._max_models:
                self._version_refs.popitem(last=False)
            return refs

    def run_object(self, run_id: str, name: str, build: Callable[[], T]) -> T:
        """A run's object that is costly to build (a fold pass's helpers): built once per process."""
        key = (run_id, name)
        with self._lock:
            found = self._run_objects.get(key)
            if found is not None:
                self._run_objects.move_to_end(key)
                return cast(T, found)
        built = build()
        with self._lock:
            self._run_objects[key] = built
            while len(self._run_objects) > self._max_models:
                self._run_objects.popitem(last=False)
        return built

    @contextlib.contextmanager
    def module(self, run_id: str, build: Callable[[], nn.Module]) -> Iterator[nn.Module]:
        """A module of the run's model that no other slot holds: reused, or built when none is idle.

        Building initializes every weight at random (a few ms for the CIFAR CNN), only to have them
        overwritten: each device loads the global weights, which resets the module completely. One
        that saw an error is not reused.
        """
        with self._lock:
            idle = self._idle_modules.get(run_id)
            module = idle.pop() if idle else None
        if module is None:
            module = build()
        yield module
        with self._lock:
            self._idle_modules.setdefault(run_id, []).append(module)
            self._idle_modules.move_to_end(run_id)
            while len(self._idle_modules) > self._max_models:
                self._idle_modules.popitem(last=False)


def run_device_task(services: Services, cache: WorkerCache, task: DeviceTask, worker: str, attempt: int) -> int:
    """Train the task's devices that have no stored result, and store each once; returns how many it stored.

    `attempt` numbers this delivery (1 for the first), as counted by `Services.start_attempt`.
    A pack delivered again (its worker died, or an attempt failed) skips the devices stored before.
    """
    from fedqueue.fl.data import device_data, load_federated
    from fedqueue.fl.devices import torch_device
    from fedqueue.fl.experiment import data_spec, resolve_plugins, train_config
    from fedqueue.fl.models import build_model

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
        job = _PackJob(
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
            device=torch_device(),
        )
        if task.mode == "vmap" and len(waiting) > 1:
            datas = [device_data(spec, device) for device in waiting]
            return job.train_together(waiting, datas, started_at, _elapsed_ms(clock))
        stored = 0
        for device in waiting:
            stored += job.train_alone(device, device_data(spec, device), started_at, _elapsed_ms(clock))
            started_at, clock = time.time(), time.perf_counter()
        return stored


class _PackJob:
    """One delivery of a device task: what it trains with, and how each device's result is stored."""

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
        device: torch.device,
    ) -> None:
        self.services, self.cache, self.task, self.worker, self.attempt = services, cache, task, worker, attempt
        self.config, self.model, self.global_state = config, model, global_state
        self.plugins, self.train, self.device = plugins, train, device

    def train_alone(self, device: int, data: TensorData, started_at: float, load_ms: float) -> int:
        """Train one device exactly as a task of its own would, and store it."""
        from fedqueue.fl.seeding import task_seed
        from fedqueue.fl.train import train_local

        # The same module serves the pack's devices: loading the weights resets it completely.
        self.model.load_state_dict(self.global_state)
        clock = time.perf_counter()
        seed = task_seed(self.config.seed, self.task.round_index, device)
        outcome = train_local(
            self.model, data, self.train, seed, self.device, self.plugins.local_step, self.plugins.options
        )
        phases = {"load_ms": load_ms, "compute_ms": _elapsed_ms(clock)}
        clock = time.perf_counter()
        ref = self._upload(device, outcome)
        timing = self._timing(device, started_at, upload_ms=_elapsed_ms(clock), **phases)
        return self._record([(self._result(device, outcome.samples, outcome.loss, ref), timing)])

    def train_together(self, devices: list[int], datas: list[TensorData], started_at: float, load_ms: float) -> int:
        """Train the devices in one vmapped computation; their timing rows are the pack's, shared."""
        from fedqueue.fl.aggregate import SUMMABLE_RULES
        from fedqueue.fl.pack_train import train_pack
        from fedqueue.fl.seeding import task_seed

        self.model.load_state_dict(self.global_state)
        clock = time.perf_counter()
        seeds = [task_seed(self.config.seed, self.task.round_index, device) for device in devices]
        pack = train_pack(
            self.model, datas, self.train, seeds, self.device, self.plugins.local_step, self.plugins.options
        )
        phases = {"load_ms": load_ms, "compute_ms": _elapsed_ms(clock)}
        task = self.task
        waiting = set(devices)
        if self.config.aggregate in SUMMABLE_RULES and strategy_for(self.config).presums_packs:
            stored = self._store_summed(devices, pack, started_at, phases)
            if stored is not None:
                return stored
            # Another delivery stored a device of the pack first: the sum counts for none; the rest go alone.
            waiting = set(unstored_devices(self.services.store, task.run_id, task.round_index, devices))
        # One Redis round trip for the pack's updates and one transaction for its rows.
        clock = time.perf_counter()
        kept = [(member, device) for member, device in enumerate(devices) if device in waiting]
        outcomes = pack.outcomes()
        blobs = [
            (update_key(task.run_id, task.round_index, device), encode_state(outcomes[member].state))
            for member, device in kept
        ]
        refs = self.services.blobs.put_many(blobs)
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
        ref = self.services.blobs.put(key, encode_state(pack.weighted_delta_sum()))
        timing = {**phases, "upload_ms": _elapsed_ms(clock), "finished_at": time.time()}
        rows = [
            (self._result(device, samples, loss, ref), self._timing(device, started_at, **timing))
            for device, samples, loss in zip(devices, pack.samples, pack.losses, strict=True)
        ]
        return self._record(rows, all_or_nothing=True) or None

    def _upload(self, device: int, outcome: TrainOutcome) -> BlobRef:
        task = self.task
        return self.services.blobs.put(update_key(task.run_id, task.round_index, device), encode_state(outcome.state))

    def _timing(self, device: int, started_at: float, **phases: float) -> TaskTiming:
        from fedqueue.fl.devices import device_label

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
            strategy_for(self.config).on_stored(self.services, self.task, max(stored), self.worker, self.cache)
        return len(stored)


def give_up_on(
    services: Services, task: DeviceTask, worker: str, attempts: int, error: str, device_used: str = "-"
) -> None:
    """A task that failed every attempt: a pack's devices are tried again one by one, a lone device is stored failed.

    So a poisoned device fails alone, and its pack-mates are stored.
    """
    if len(task.devices) == 1:
        record_failure(services, task, worker, attempts, error, device_used)
        return
    waiting = unstored_devices(services.store, task.run_id, task.round_index, task.devices)
    log.warning("%s failed %d attempts; its %d unstored devices go on alone", task.label, attempts, len(waiting))
    now = time.time()
    services.enqueue([task.alone(device, now) for device in waiting])


def record_failure(
    services: Services, task: DeviceTask, worker: str, attempts: int, error: str, device_used: str = "-"
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
        config = RunConfig.from_dict(services.store.get_run(task.run_id).config)
        strategy_for(config).on_stored(services, task, stored, worker)


def _elapsed_ms(start: float) -> float:
    return (time.perf_counter() - start) * 1000
