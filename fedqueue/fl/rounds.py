"""Plans rounds, publishes the global model, enqueues device tasks, aggregates finished rounds.

Each step is a transition recorded in the store, so any process can take the
next one, and a transition is taken once: `add_round` records a round once,
`claim_round` lets one aggregator work at a time, and the aggregator renews its
claim while it works, so it is taken over only once its holder is gone.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from fedqueue.core.blobs import blobs_per_read
from fedqueue.core.codec import BlobRef
from fedqueue.core.keys import global_key, is_pack_sum_key
from fedqueue.core.services import Services
from fedqueue.fl.config import RunConfig
from fedqueue.fl.messages import KIND_NAME, DeviceTask
from fedqueue.fl.read_ahead import ReadAhead, read_round_ahead
from fedqueue.fl.results import (
    add_round,
    claim_round,
    complete_round,
    count_done,
    get_round,
    load_checkpoint,
    renew_claim,
    round_outcomes,
    save_checkpoint,
    unclaim_round,
)
from fedqueue.fl.schema import RoundRow
from fedqueue.fl.weights import decode_state, encode_state
from fedqueue.store import Store

if TYPE_CHECKING:
    import torch
    from sqlalchemy.engine import Row

    from fedqueue.fl.aggregate import LoadedOnUse

log = logging.getLogger(__name__)

UPDATES_READ_AHEAD = 4  # updates fetched and checked in the background while one is summed


def select_devices(seed: int, round_index: int, num_devices: int, per_round: int) -> list[int]:
    """The devices of one round: seeded by (seed, round), sorted, independent of anything else."""
    rng = np.random.default_rng([seed, round_index])
    return sorted(int(device) for device in rng.choice(num_devices, size=per_round, replace=False))


def cut_packs(selected: Sequence[int], pack_size: int) -> list[tuple[int, ...]]:
    """A round's packs: its sorted selection cut every `pack_size` devices, whatever the workers."""
    return [tuple(selected[start : start + pack_size]) for start in range(0, len(selected), pack_size)]


def pack_tasks(
    run_id: str, round_index: int, config: RunConfig, selected: Sequence[int], model: BlobRef, enqueued_at: float
) -> list[DeviceTask]:
    """The device tasks of a round, one per pack."""
    packs = cut_packs(selected, config.resolved_pack_size)
    return tasks_of_packs(run_id, round_index, config, packs, model, enqueued_at, len(selected))


def tasks_of_packs(
    run_id: str,
    round_index: int,
    config: RunConfig,
    packs: Sequence[tuple[int, ...]],
    model: BlobRef,
    enqueued_at: float,
    round_size: int,
) -> list[DeviceTask]:
    """One device task per pack, all training `model`; a pack of one device always trains as it would alone."""
    return [
        DeviceTask(
            run_id=run_id,
            round_index=round_index,
            devices=pack,
            model=model,
            enqueued_at=enqueued_at,
            round_size=round_size,
            mode=config.resolved_pack_mode if len(pack) > 1 else "sequential",
        )
        for pack in packs
    ]


def new_run_id() -> str:
    return uuid.uuid4().hex[:12]


def submit_run(services: Services, config: RunConfig, run_id: str | None = None) -> str:
    """Record the run, publish version 0 of the model and enqueue round 1."""
    from fedqueue.fl.data import load_federated
    from fedqueue.fl.experiment import call_plugin, check_plugins, data_spec, resolve_packing
    from fedqueue.fl.models import initial_state
    from fedqueue.fl.strategy import strategy_for

    check_plugins(config)
    run_id = run_id or new_run_id()
    data = call_plugin("dataset", config.dataset, load_federated, data_spec(config))
    state = call_plugin(
        "model",
        config.model,
        initial_state,
        config.model,
        data.input_shape,
        data.num_classes,
        config.seed,
        config.plugin,
    )
    # After the model plugin proved it builds: packing builds it again, and tries a vmapped step.
    config = resolve_packing(config, data, services.worker_slots)
    encoded = encode_state(state)
    services.store.create_run(
        run_id,
        config.name,
        config.to_dict(),
        config.last_version,
        kind=KIND_NAME,
        broker_id=services.ledger.broker_id(),
    )
    checkpoint_version(services, run_id, 0, encoded)
    strategy_for(config).start(services, run_id, config, encoded)
    return run_id


def round_key(run_id: str, round_index: int) -> str:
    return f"{run_id}:{round_index}"


def start_round(services: Services, run_id: str, config: RunConfig, round_index: int, model: bytes) -> bool:
    """Record and enqueue a round; False when another starter (an aggregator, a repair pass) already did."""
    version = round_index - 1
    ref = services.blobs.put(global_key(run_id, version), model)
    selected = select_devices(config.seed, round_index, config.num_devices, config.devices_per_round)
    now = time.time()
    recorded = add_round(
        services.store,
        RoundRow(
            run_id=run_id,
            round_index=round_index,
            version=version,
            state="training",
            selected=selected,
            model_key=ref.key,
            model_sha256=ref.sha256,
            model_nbytes=ref.nbytes,
            enqueued_at=now,
        ),
    )
    if not recorded:
        return False
    services.enqueue(pack_tasks(run_id, round_index, config, selected, ref, now))
    services.ledger.mark_enqueued(round_key(run_id, round_index))
    return True


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


def aggregate_round(services: Services, run_id: str, round_index: int, owner: str) -> float | None:
    """Aggregate a round, evaluate, checkpoint, start the next; when the aggregation began, or None if not done.

    Requested in the round's tail, it first reads the updates already stored while the last
    devices train (fedqueue.fl.read_ahead), and gives up if the tail outlasts its limit.
    The claim is renewed while this runs. A failure hands it back and raises, so the task is retried.
    """
    row = get_round(services.store, run_id, round_index)
    if row is None:
        return None
    ahead = ReadAhead()
    if count_done(services.store, run_id, round_index) < len(row.selected):
        if row.state != "training":
            return None
        waited = read_round_ahead(services, run_id, round_index, len(row.selected))
        if waited is None:
            return None
        ahead = waited
    began = time.time()
    stale_before = began - services.settings.heartbeat_ttl_s
    if not claim_round(services.store, run_id, round_index, owner, stale_before):
        return None
    try:
        renew = functools.partial(renew_claim, services.store, run_id, round_index, owner)
        with renewing(services, renew, f"run {run_id} round {round_index}") as lost:
            _aggregate_claimed_round(services, run_id, round_index, owner, lost, ahead)
    except ClaimLost:
        log.warning("run %s round %d: aggregation taken over by another worker; stopped", run_id, round_index)
        return None
    except BaseException:
        unclaim_round(services.store, run_id, round_index, owner)
        raise
    return began


def fail_aggregation(services: Services, run_id: str, round_index: int, attempts: int, error: str) -> None:
    """A round whose aggregation failed every attempt ends its run, with the error for `fedqueue status`."""
    services.store.finish_run(
        run_id, "failed", f"round {round_index}: aggregation failed after {attempts} attempts\n{error}"
    )


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


def _aggregate_claimed_round(
    services: Services, run_id: str, round_index: int, owner: str, lost: threading.Event, ahead: ReadAhead
) -> None:
    from fedqueue.fl.aggregate import SUMMABLE_RULES, fedavg
    from fedqueue.fl.experiment import resolve_plugins

    run = services.store.get_run(run_id)
    if run.state != "running":
        return
    config = RunConfig.from_dict(run.config)
    row = get_round(services.store, run_id, round_index)
    assert row is not None
    tasks = round_outcomes(services.store, run_id, round_index)
    stop = _policy_failure(config, round_index, tasks)
    if stop is not None:
        if complete_round(services.store, run_id, round_index, owner, state="failed"):
            services.store.finish_run(run_id, "failed", stop)
        return
    results = [task for task in tasks if task.state == "done"]
    began = time.perf_counter()
    global_state = decode_state(
        services.blobs.get(BlobRef(key=row.model_key, sha256=row.model_sha256, nbytes=row.model_nbytes))
    )
    alone, packs = _updates_of(results)
    # Each update is read as the rule reaches it (a few ahead): memory stays flat whatever the round's size.
    with _loaded(services, alone, ahead) as updates, _loaded(services, packs, ahead) as sums:
        if sums:
            if config.aggregate not in SUMMABLE_RULES:
                raise RuntimeError(f"round {round_index}: pre-summed packs, but aggregate = {config.aggregate!r}")
            new_state = fedavg(global_state, updates, config.global_lr, sums)
        else:
            new_state = resolve_plugins(config).aggregate(global_state, updates, config.global_lr, config.plugin)
    encoded = encode_state(new_state)
    aggregate_ms = (time.perf_counter() - began) * 1000

    metrics: dict[str, Any] = {"aggregate_ms": aggregate_ms, "read_ahead": ahead.count}
    weights = [task.samples for task in results]
    losses = [task.loss for task in results]
    if losses and all(loss is not None for loss in losses):
        metrics["train_loss"] = float(np.average(losses, weights=weights))
    metrics.update(evaluate_version(config, round_index, new_state))
    metrics["sim_time"] = _round_sim_time(services, config, run_id, row)

    if lost.is_set() or not renew_claim(services.store, run_id, round_index, owner):
        raise ClaimLost()
    checkpoint_version(services, run_id, round_index, encoded)
    if not complete_round(services.store, run_id, round_index, owner, **metrics):
        raise ClaimLost()
    services.blobs.delete(list(dict.fromkeys(task.update_key for task in results if task.update_key)))
    services.blobs.delete([row.model_key])
    start_next(services, run_id, config, round_index, encoded)
    log.info("run %s round %d aggregated from %d devices", run_id, round_index, len(results))


def _round_sim_time(services: Services, config: RunConfig, run_id: str, row: RoundRow) -> float:
    """When the round ends in simulated time: the previous round's end plus its slowest selected device's trip."""
    from fedqueue.fl.experiment import run_clock

    clock = run_clock(config)
    previous = get_round(services.store, run_id, row.round_index - 1) if row.round_index > 1 else None
    began = (previous.sim_time or 0.0) if previous is not None else 0.0
    return began + max((clock.trip_seconds(row.round_index, device) for device in row.selected), default=0.0)


def evaluate_version(config: RunConfig, version: int, state: Mapping[str, torch.Tensor]) -> dict[str, float]:
    """Held-out accuracy and loss of a version, every `eval_every` versions and at the last; else nothing."""
    from fedqueue.fl.data import load_federated
    from fedqueue.fl.devices import torch_device
    from fedqueue.fl.evaluate import evaluate
    from fedqueue.fl.experiment import data_spec
    from fedqueue.fl.models import build_model

    if version % config.eval_every != 0 and version != config.last_version:
        return {}
    began = time.perf_counter()
    data = load_federated(data_spec(config))
    device = torch_device()
    model = build_model(config.model, data.input_shape, data.num_classes, config.plugin)
    model.load_state_dict(state)
    accuracy, loss = evaluate(model.to(device), data.test, device)
    return {"accuracy": accuracy, "loss": loss, "eval_ms": (time.perf_counter() - began) * 1000}


_Stored = tuple[int, int, BlobRef]  # (device, samples, its update); for a pack: its lowest device, its samples


def _updates_of(results: Sequence[Row[Any]]) -> tuple[list[_Stored], list[_Stored]]:
    """The round's updates: devices stored alone, and packs stored as one pre-summed update."""
    alone: list[_Stored] = []
    packs: dict[str, list[Row[Any]]] = {}
    for task in results:
        assert task.update_key and task.update_sha256 and task.update_nbytes is not None
        if is_pack_sum_key(task.update_key):
            packs.setdefault(task.update_key, []).append(task)
        else:
            ref = BlobRef(key=task.update_key, sha256=task.update_sha256, nbytes=task.update_nbytes)
            alone.append((task.device, task.samples, ref))
    summed = [
        (
            min(task.device for task in pack),
            sum(task.samples for task in pack),
            BlobRef(key=key, sha256=pack[0].update_sha256, nbytes=pack[0].update_nbytes),
        )
        for key, pack in packs.items()
    ]
    return alone, summed


def _loaded(services: Services, stored: Sequence[_Stored], ahead: ReadAhead) -> LoadedOnUse:
    """Updates as they are used: those read ahead from memory, the rest from the blob store, many per round trip."""
    from fedqueue.fl.aggregate import LoadedOnUse

    refs = [ref for _, _, ref in stored]

    def load_many(positions: Sequence[int]) -> list[Mapping[str, torch.Tensor]]:
        wanted = [refs[position] for position in positions]
        held = {ref.key: ahead.take(ref.key) for ref in wanted}
        missing = [ref for ref in wanted if held[ref.key] is None]
        fetched = dict(zip((ref.key for ref in missing), services.blobs.get_many(missing), strict=True))
        return [held[ref.key] or decode_state(fetched[ref.key]) for ref in wanted]  # a state is never empty

    return LoadedOnUse(
        [(device, samples) for device, samples, _ in stored],
        lambda position: load_many([position])[0],
        read_ahead=UPDATES_READ_AHEAD,
        load_many=load_many,
        chunk=blobs_per_read(refs),
    )


def start_next(services: Services, run_id: str, config: RunConfig, done_round: int, model: bytes) -> bool:
    """After a round is done: start the next one, or finish the run after the last. Idempotent."""
    if done_round < config.rounds:
        return start_round(services, run_id, config, done_round + 1, model)
    services.blobs.put(global_key(run_id, done_round), model)
    return services.store.finish_run(run_id, "finished")


def checkpoint_version(services: Services, run_id: str, version: int, encoded: bytes) -> None:
    save_checkpoint(services.store, run_id, version, hashlib.sha256(encoded).hexdigest(), encoded)


def final_state(store: Store, run_id: str) -> dict[str, torch.Tensor]:
    """The latest checkpointed global weights of a run."""
    checkpoint = load_checkpoint(store, run_id)
    if checkpoint is None:
        raise LookupError(f"run {run_id} has no checkpoint")
    return decode_state(checkpoint.data)
