"""Shared test helpers: submit and wait on real services, and an in-process reference run."""

from __future__ import annotations

import time

import redis
import torch

from fedqueue.config import Settings
from fedqueue.core.broker.ledger import RedisLedger
from fedqueue.core.services import Services
from fedqueue.fl.config import RunConfig
from fedqueue.fl.scheduler import submit_run
from fedqueue.fl.strategy.common import final_state
from fedqueue.fl.strategy.sync.rounds import select_devices
from fedqueue.queue.client import open_client_services
from fedqueue.store import Store


def small_config(**overrides: object) -> RunConfig:
    base: dict[str, object] = {
        "dataset": "digits",
        "model": "mlp",
        "num_devices": 30,
        "devices_per_round": 8,
        "rounds": 2,
        "local_iters": 5,
        "local_batch_size": 8,
        "local_lr": 0.1,
        "local_momentum": 0.5,
        "seed": 7,
        # One device per task, as reference_final_state trains them (the default "auto" may pack them).
        "pack_size": 1,
        "pack_mode": "sequential",
    }
    base.update(overrides)
    return RunConfig.from_dict(base)


def wait_finished(store: Store, run_id: str, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if store.get_run(run_id).state != "running":
            return
        time.sleep(0.1)
    raise AssertionError(f"run {run_id} did not finish within {timeout_s} s")


def run_to_end(settings: Settings, config: RunConfig, services: Services | None = None) -> tuple[str, Services]:
    services = services or open_client_services(settings)
    run_id = submit_run(services, config)
    wait_finished(services.store, run_id)
    return run_id, services


def broker_redis(services: Services) -> redis.Redis:
    """The broker's Redis client, which services opened on a real broker keep in their ledger."""
    assert isinstance(services.ledger, RedisLedger), "these services have no broker (an in-memory ledger)"
    return services.ledger.redis


def blob_keys_left(services: Services) -> list[str]:
    """The keys of every blob still kept: in the broker, and in this host's shared memory where blobs go there."""
    from fedqueue.core.broker import keys
    from fedqueue.core.broker.shm import PARTIAL, SPARE, SharedMemoryBlobStore

    prefix = keys.blob_prefix(services.settings.key_prefix)
    found = {key.decode()[len(prefix) :] for key in broker_redis(services).scan_iter(match=f"{prefix}*")}
    if isinstance(services.blobs, SharedMemoryBlobStore) and services.blobs.root.is_dir():
        root = services.blobs.root
        # A blob is the file ROOT/<key>/<digest>; half-written files wait in ROOT/PARTIAL, and freed blobs' files
        # wait in ROOT/SPARE to be written over (no key names them; they go when a minute unused).
        found |= {
            path.parent.relative_to(root).as_posix()
            for path in root.rglob("*")
            if path.is_file() and not {PARTIAL, SPARE} & set(path.relative_to(root).parts)
        }
    return sorted(found)


def reference_final_state(config: RunConfig) -> dict[str, torch.Tensor]:
    """The same experiment, computed in this process with no queue: what the workers must match."""
    from fedqueue.fl.ml.aggregate import fedavg
    from fedqueue.fl.ml.data import device_data, load_federated
    from fedqueue.fl.ml.models import build_model, initial_state
    from fedqueue.fl.ml.seeding import task_seed
    from fedqueue.fl.ml.train import train_local
    from fedqueue.fl.setup import data_spec, train_config

    torch.set_num_threads(1)  # the workers' threads_per_task
    spec = data_spec(config)
    data = load_federated(spec)
    state = initial_state(config.model, data.input_shape, data.num_classes, config.seed)
    for round_index in range(1, config.rounds + 1):
        updates = []
        for device in select_devices(config.seed, round_index, config.num_devices, config.devices_per_round):
            model = build_model(config.model, data.input_shape, data.num_classes)
            model.load_state_dict(state)
            seed = task_seed(config.seed, round_index, device)
            outcome = train_local(model, device_data(spec, device), train_config(config), seed, torch.device("cpu"))
            updates.append((device, outcome.samples, outcome.state))
        state = fedavg(state, updates, config.global_lr)
    return state


def held_out_accuracy(config: RunConfig, state: dict[str, torch.Tensor]) -> float:
    from fedqueue.fl.ml.data import load_federated
    from fedqueue.fl.ml.evaluate import evaluate
    from fedqueue.fl.ml.models import build_model
    from fedqueue.fl.setup import data_spec

    data = load_federated(data_spec(config))
    model = build_model(config.model, data.input_shape, data.num_classes)
    model.load_state_dict(state)
    return evaluate(model, data.test, torch.device("cpu"))[0]


def assert_same_weights(left: dict[str, torch.Tensor], right: dict[str, torch.Tensor]) -> None:
    assert left.keys() == right.keys()
    for name in left:
        assert torch.equal(left[name], right[name]), f"{name} differs"


__all__ = ["final_state", "small_config", "run_to_end", "reference_final_state", "assert_same_weights", "wait_finished"]
