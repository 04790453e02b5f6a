"""Plans rounds, publishes the global model, enqueues device tasks, aggregates finished rounds.

Each step is a transition recorded in the store, so any process (the CLI or the
worker that stores a round's last result) can take the next one, and a
transition is taken once: `claim_round` lets exactly one caller aggregate.
"""

from __future__ import annotations

import hashlib
import logging
import time
import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from fedqueue.blobs import decode_state, encode_state
from fedqueue.messages import BlobRef, DeviceTask
from fedqueue.runconfig import RunConfig
from fedqueue.services import Services
from fedqueue.store import Store
from fedqueue.store.schema import RoundRow

if TYPE_CHECKING:
    import torch
    from sqlalchemy.engine import Row

log = logging.getLogger(__name__)

UPDATES_READ_AHEAD = 4  # updates fetched and checked in the background while one is summed


def select_devices(seed: int, round_index: int, num_devices: int, per_round: int) -> list[int]:
    """The devices of one round: seeded by (seed, round), sorted, independent of anything else."""
    rng = np.random.default_rng([seed, round_index])
    return sorted(int(device) for device in rng.choice(num_devices, size=per_round, replace=False))


def global_key(run_id: str, version: int) -> str:
    return f"{run_id}/global/{version}"


def update_key(run_id: str, round_index: int, device: int) -> str:
    # A fresh suffix per attempt: a duplicate delivery never overwrites the stored winner's blob.
    return f"{run_id}/update/{round_index}/{device}/{uuid.uuid4().hex[:8]}"


def new_run_id() -> str:
    return uuid.uuid4().hex[:12]


def submit_run(services: Services, config: RunConfig, run_id: str | None = None) -> str:
    """Record the run, publish version 0 of the model and enqueue round 1."""
    from fedqueue.experiment import call_plugin, check_plugins, data_spec
    from fedqueue.fl.data import load_federated
    from fedqueue.fl.models import initial_state

    check_plugins(config)
    run_id = run_id or new_run_id()
    data = call_plugin("dataset", config.dataset, load_federated, data_spec(config))
    state = call_plugin(
        "model", config.model, initial_state, config.model, data.input_shape, data.num_classes, config.seed,
        config.plugin,
    )
    encoded = encode_state(state)
    services.store.create_run(run_id, config.name, config.to_dict(), config.rounds)
    services.mark_broker_state(run_id)
    _checkpoint(services, run_id, 0, encoded)
    start_round(services, run_id, config, 1, encoded)
    return run_id


def start_round(services: Services, run_id: str, config: RunConfig, round_index: int, model: bytes) -> None:
    version = round_index - 1
    ref = services.blobs.put(global_key(run_id, version), model)
    selected = select_devices(config.seed, round_index, config.num_devices, config.devices_per_round)
    now = time.time()
    services.store.add_round(
        RoundRow(
            run_id=run_id, round_index=round_index, version=version, state="training", selected=selected,
            model_key=ref.key, model_sha256=ref.sha256, model_nbytes=ref.nbytes, enqueued_at=now,
        )
    )
    services.enqueue(
        [DeviceTask(run_id=run_id, round_index=round_index, device=device, model=ref, enqueued_at=now,
                    round_size=len(selected))
         for device in selected]
    )
    services.mark_enqueued(run_id, round_index)


def round_is_complete(services: Services, run_id: str, round_index: int) -> bool:
    row = services.store.get_round(run_id, round_index)
    return row is not None and services.store.count_done(run_id, round_index) >= len(row.selected)


def finish_round(services: Services, run_id: str, round_index: int, stale_before: float | None = None) -> bool:
    """Aggregate a complete round, evaluate, checkpoint, start the next. False if another caller won.

    A failure while aggregating hands the claim back, so the round can be finished again.
    """
    if not round_is_complete(services, run_id, round_index):
        return False
    if not services.store.claim_round(run_id, round_index, stale_before):
        return False
    try:
        _aggregate_claimed_round(services, run_id, round_index)
    except BaseException:
        services.store.unclaim_round(run_id, round_index)
        raise
    return True


def _policy_failure(config: RunConfig, round_index: int, tasks: Sequence[Row[Any]]) -> str | None:
    """Why the round must stop the run under its failure policy, or None to aggregate what succeeded."""
    failed = [task for task in tasks if task.state != "done"]
    succeeded = len(tasks) - len(failed)
    if failed and config.on_failure == "abort":
        first = failed[0]
        reason = (first.error or "").strip().splitlines()[-1:] or ["unknown error"]
        return f"round {round_index}: device {first.device} failed ({reason[0]}) and on_failure = 'abort'"
    if succeeded == 0:
        return f"round {round_index}: every selected device failed"
    if succeeded < config.min_devices_per_round:
        return (
            f"round {round_index}: only {succeeded} of {len(tasks)} devices succeeded, "
            f"below min_devices_per_round = {config.min_devices_per_round}"
        )
    return None


def _aggregate_claimed_round(services: Services, run_id: str, round_index: int) -> None:
    from fedqueue.experiment import data_spec, resolve_plugins
    from fedqueue.fl.aggregate import LoadedOnUse
    from fedqueue.fl.data import load_federated
    from fedqueue.fl.devices import torch_device
    from fedqueue.fl.evaluate import evaluate
    from fedqueue.fl.models import build_model

    run = services.store.get_run(run_id)
    if run.state != "running":
        return
    config = RunConfig.from_dict(run.config)
    row = services.store.get_round(run_id, round_index)
    assert row is not None
    tasks = services.store.round_outcomes(run_id, round_index)
    stop = _policy_failure(config, round_index, tasks)
    if stop is not None:
        services.store.complete_round(run_id, round_index)
        services.store.finish_run(run_id, "failed", stop)
        return
    results = [task for task in tasks if task.state == "done"]
    began = time.perf_counter()
    global_state = decode_state(
        services.blobs.get(BlobRef(key=row.model_key, sha256=row.model_sha256, nbytes=row.model_nbytes))
    )
    refs = []
    for task in results:
        assert task.update_key and task.update_sha256 and task.update_nbytes is not None
        refs.append(BlobRef(key=task.update_key, sha256=task.update_sha256, nbytes=task.update_nbytes))
    # Each update is read as the rule reaches it (a few ahead): memory stays flat whatever the round's size.
    with LoadedOnUse(
        [(task.device, task.samples) for task in results],
        lambda position: decode_state(services.blobs.get(refs[position])),
        read_ahead=UPDATES_READ_AHEAD,
    ) as updates:
        new_state = resolve_plugins(config).aggregate(global_state, updates, config.global_lr, config.plugin)
    encoded = encode_state(new_state)
    aggregate_ms = (time.perf_counter() - began) * 1000

    metrics: dict[str, float | None] = {"aggregate_ms": aggregate_ms}
    weights = [task.samples for task in results]
    losses = [task.loss for task in results]
    if losses and all(loss is not None for loss in losses):
        metrics["train_loss"] = float(np.average(losses, weights=weights))
    if round_index % config.eval_every == 0 or round_index == config.rounds:
        began = time.perf_counter()
        data = load_federated(data_spec(config))
        device = torch_device()
        model = build_model(config.model, data.input_shape, data.num_classes, config.plugin)
        model.load_state_dict(new_state)
        accuracy, loss = evaluate(model.to(device), data.test, device)
        metrics.update(accuracy=accuracy, loss=loss, eval_ms=(time.perf_counter() - began) * 1000)

    _checkpoint(services, run_id, round_index, encoded)
    services.store.complete_round(run_id, round_index, **metrics)
    services.blobs.delete([task.update_key for task in results if task.update_key])
    services.blobs.delete([row.model_key])
    if round_index < config.rounds:
        start_round(services, run_id, config, round_index + 1, encoded)
    else:
        services.blobs.put(global_key(run_id, round_index), encoded)
        services.store.finish_run(run_id, "finished")
    log.info("run %s round %d aggregated from %d updates", run_id, round_index, len(updates))


def _checkpoint(services: Services, run_id: str, version: int, encoded: bytes) -> None:
    services.store.save_checkpoint(run_id, version, hashlib.sha256(encoded).hexdigest(), encoded)


def final_state(store: Store, run_id: str) -> dict[str, torch.Tensor]:
    """The latest checkpointed global weights of a run."""
    checkpoint = store.load_checkpoint(run_id)
    if checkpoint is None:
        raise LookupError(f"run {run_id} has no checkpoint")
    return decode_state(checkpoint.data)
