"""Plans rounds, publishes the global model, enqueues device tasks, aggregates finished rounds.

Each step is a transition recorded in the store, so any process can take the
next one, and a transition is taken once: `add_round` records a round once,
`claim_round` lets one aggregator work at a time, and the aggregator renews its
claim while it works, so it is taken over only once its holder is gone.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from fedqueue.core.broker.blobs import blobs_per_read, checked_blob
from fedqueue.core.codec import BlobRef
from fedqueue.core.services import Services
from fedqueue.errors import BlobIntegrityError
from fedqueue.fl.clock.stops import Stop, accuracy_stop, time_stop, version_stop
from fedqueue.fl.config import RunConfig
from fedqueue.fl.messages import aggregate_key, global_key
from fedqueue.fl.ml.weights import decode_state
from fedqueue.fl.packs.tasks import tasks_of_round
from fedqueue.fl.store.results import (
    add_round,
    claim_is_stale,
    claim_round,
    complete_round,
    count_done,
    get_round,
    list_rounds,
    renew_claim,
    round_outcomes,
    unclaim_round,
)
from fedqueue.fl.store.schema import RoundRow
from fedqueue.fl.store.states import keep_named_states
from fedqueue.fl.store.stop_rows import record_stop
from fedqueue.fl.strategy.common import ClaimLost, checkpoint_bytes, checkpoint_version, evaluate_version, renewing
from fedqueue.fl.strategy.sync.early_fold import EarlyFold
from fedqueue.fl.strategy.sync.read_ahead import ReadAhead, read_round_ahead
from fedqueue.fl.strategy.sync.requests import request_aggregation
from fedqueue.fl.strategy.sync.round_updates import StoredUpdate, updates_of
from fedqueue.fl.worker.state_blobs import get_state, get_states, publish_state, recycle_states

if TYPE_CHECKING:
    import torch
    from sqlalchemy.engine import Row

    # torch, as in aggregation
    from fedqueue.fl.ml.aggregate import LoadedOnUse
    from fedqueue.fl.worker.cache import WorkerCache

log = logging.getLogger(__name__)

UPDATES_READ_AHEAD = 4  # updates fetched and checked in the background while one is summed
CLOSING_POLL_S = 0.02  # how often an aggregation asks whether the round before it has closed


def select_devices(seed: int, round_index: int, num_devices: int, per_round: int) -> list[int]:
    """The devices of one round: seeded by (seed, round), sorted, independent of anything else."""
    rng = np.random.default_rng([seed, round_index])
    return sorted(int(device) for device in rng.choice(num_devices, size=per_round, replace=False))


def round_key(run_id: str, round_index: int) -> str:
    return f"{run_id}:{round_index}"


def start_round(services: Services, run_id: str, config: RunConfig, round_index: int, model: bytes | BlobRef) -> bool:
    """Record and enqueue a round; False when another starter (an aggregator, a repair pass) already did.

    `model`: the round's global model, or where its aggregator already published it (`publish_version`)."""
    version = round_index - 1
    ref = model if isinstance(model, BlobRef) else publish_version(services, run_id, version, model)
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
    services.enqueue(tasks_of_round(run_id, round_index, config, selected, ref, now))
    services.ledger.mark_enqueued(round_key(run_id, round_index))
    return True


def publish_version(services: Services, run_id: str, version: int, model: bytes) -> BlobRef:
    return services.blobs.put(global_key(run_id, version), model)


def _round_model(
    services: Services, cache: WorkerCache | None, run_id: str, row: RoundRow
) -> Mapping[str, torch.Tensor]:
    """The round's global model: from this worker's memory (it trained on it), from the blob store, or, when a
    broker restarted empty lost it after the round's devices had all been stored (no repair pass republishes it
    then), from the store's checkpoint of it. Read only: a cached state is shared with this worker's tasks."""
    ref = BlobRef(key=row.model_key, sha256=row.model_sha256, nbytes=row.model_nbytes)
    try:
        return cache.global_state(services, ref) if cache is not None else get_state(services.blobs, ref)
    except BlobIntegrityError:
        log.warning(
            "run %s round %s: global model %s not in the broker; read from the store",
            run_id,
            row.round_index,
            row.version,
        )
        return decode_state(checked_blob(ref, checkpoint_bytes(services, run_id, row.version)))


def aggregate_round(
    services: Services, run_id: str, round_index: int, owner: str, cache: WorkerCache | None = None
) -> float | None:
    """Aggregate a round, evaluate, checkpoint, start the next; when the aggregation began, or None if not done.
    `cache`: this worker's, where the round's model may already be.

    Requested in the round's tail, it first reads the updates already stored while the last
    devices train (fedqueue.fl.strategy.sync.read_ahead), begins FedAvg's sum over those that lead in
    device order (fedqueue.fl.strategy.sync.early_fold), and gives up if the tail outlasts its limit.
    The claim is renewed while this runs. A failure hands it back and raises, so the task is retried.
    """
    row = get_round(services.store, run_id, round_index)
    if row is None:
        return None
    ahead = ReadAhead()
    try:
        return _aggregate_round(services, run_id, row, owner, cache, ahead)
    finally:
        ahead.discard()  # a sum begun in the tail and not stepped: kept for the next fold


def _aggregate_round(
    services: Services, run_id: str, row: RoundRow, owner: str, cache: WorkerCache | None, ahead: ReadAhead
) -> float | None:
    round_index = row.round_index
    if count_done(services.store, run_id, round_index) < len(row.selected):
        if row.state != "training":
            return None
        ahead.early = _early_fold(services, cache, run_id, row)
        if read_round_ahead(services, run_id, round_index, len(row.selected), into=ahead) is None:
            return None
    if not _previous_closed(services, run_id, round_index):
        # Its closer (or the repair pass that finishes it) requests this aggregation again.
        services.ledger.forget_request(aggregate_key(run_id, round_index))
        return None
    began = time.time()
    stale_before = began - services.settings.heartbeat_ttl_s
    if not claim_round(services.store, run_id, round_index, owner, stale_before):
        return None
    try:
        renew = functools.partial(renew_claim, services.store, run_id, round_index, owner)
        with renewing(services, renew, f"run {run_id} round {round_index}") as lost:
            _aggregate_claimed_round(services, cache, run_id, round_index, owner, lost, ahead)
    except ClaimLost:
        log.warning("run %s round %d: aggregation taken over by another worker; stopped", run_id, round_index)
        return None
    except BaseException:
        unclaim_round(services.store, run_id, round_index, owner)
        raise
    return began


def _previous_closed(services: Services, run_id: str, round_index: int) -> bool:
    """Wait for the round before this one to close (its checkpoint commits after this round started); False
    when it will not soon: handed back, its claim no longer renewed, or still open past a claim period."""
    ttl_s = services.settings.heartbeat_ttl_s
    deadline = time.monotonic() + ttl_s
    while True:
        previous = get_round(services.store, run_id, round_index - 1) if round_index > 1 else None
        if previous is None or previous.state != "aggregating":
            return previous is None or previous.state == "done"
        if claim_is_stale(previous, ttl_s) or time.monotonic() > deadline:
            return False
        time.sleep(CLOSING_POLL_S)


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
    services: Services,
    cache: WorkerCache | None,
    run_id: str,
    round_index: int,
    owner: str,
    lost: threading.Event,
    ahead: ReadAhead,
) -> None:
    # torch: loaded by the worker that aggregates, not by the command line
    from fedqueue.fl.ml.aggregate import SUMMABLE_RULES
    from fedqueue.fl.ml.stat_resnet import reset_trackers
    from fedqueue.fl.setup import resolve_plugins

    run = services.store.get_run(run_id)
    if run.state != "running":
        return
    config = RunConfig.from_stored(run.config)
    row = get_round(services.store, run_id, round_index)
    assert row is not None
    tasks = round_outcomes(services.store, run_id, round_index)
    stop = _policy_failure(config, round_index, tasks)
    if stop is not None:
        if complete_round(services.store, run_id, round_index, owner, state="failed"):
            services.store.finish_run(run_id, "failed", stop)
            # Nothing reads the round's blobs again: they leave the broker now, not when their TTL ends.
            services.blobs.delete([task.update_key for task in tasks if task.update_key] + [row.model_key])
        return
    results = [task for task in tasks if task.state == "done"]
    began = time.perf_counter()
    global_state = (
        ahead.early.sum.global_state if ahead.early is not None else _round_model(services, cache, run_id, row)
    )
    updates = updates_of(results)
    aggregate = config.plugin_names()["aggregate"]
    if aggregate in SUMMABLE_RULES:
        new_state = _fedavg_of(services, global_state, updates, ahead, config.global_lr)
    elif any(update.summed for update in updates):
        raise RuntimeError(f"round {round_index}: pre-summed packs, but aggregate = {aggregate!r}")
    else:
        # Each update is read as the rule reaches it (a few ahead): memory stays flat whatever the round's size.
        with _loaded(services, updates, ahead) as loaded:
            new_state = resolve_plugins(config).aggregate(global_state, loaded, config.global_lr, config.plugin)
    # FedRevive: a new version carries no feature statistics of its own (a no-op without trackers).
    new_state = reset_trackers(new_state)
    aggregate_ms = (time.perf_counter() - began) * 1000

    metrics: dict[str, Any] = {"aggregate_ms": aggregate_ms, "read_ahead": ahead.count}
    weights = [task.samples for task in results]
    losses = [task.loss for task in results]
    if losses and all(loss is not None for loss in losses):
        metrics["train_loss"] = float(np.average(losses, weights=weights))
    # The last round by rounds_total (max_sim_time may cut it short) is evaluated as the last.
    metrics.update(evaluate_version(config, round_index, new_state, last=round_index >= run.rounds_total))
    metrics["sim_time"] = _round_sim_time(services, config, run_id, row)

    if lost.is_set() or not renew_claim(services.store, run_id, round_index, owner):
        raise ClaimLost()
    # Published before the round is closed, to checkpoint it with the digest its ref carries (one sha256 of the
    # model, taken as it is written; its bytes read back from there): an aggregator that takes over publishes
    # the same bytes under the same key.
    published, encoded = publish_state(services.blobs, global_key(run_id, round_index), new_state)
    ends = stop_after(services, run_id, config, round_index, closing=metrics)
    if ends is None:
        # The next round trains while this one's checkpoint commits (a 45 MB model takes hundreds of ms): the
        # round stays claimed until its checkpoint is in, and the repair pass looks after it beside the new one.
        start_round(services, run_id, config, round_index + 1, published)
    checkpoint_version(services, run_id, round_index, encoded, published.sha256)
    if not complete_round(services.store, run_id, round_index, owner, **metrics):
        raise ClaimLost()
    if ends is not None:
        finish_run(services, run_id, ends)
    else:
        _after_closing(services, run_id, round_index, published, encoded)
    # After the next round is out: freeing a round's blobs holds no slot back. The files of its updates and of
    # its model (read by its devices, all stored, and by the checkpoint of the round before, closed before this
    # one's aggregation began) are written over by the next states: pages in place, where a new file's pages
    # can cost 5x the write (an aggregator still reading them lost its claim and publishes nothing). After
    # the last round they go.
    spent = [*dict.fromkeys(task.update_key for task in results if task.update_key), row.model_key]
    if ends is None:
        recycle_states(services.blobs, spent)
    else:
        services.blobs.delete(spent)
    early = len(ahead.early.folded) if ahead.early is not None else 0
    log.info(
        "run %s round %d aggregated from %d devices (%d updates folded early)", run_id, round_index, len(results), early
    )


def _round_sim_time(services: Services, config: RunConfig, run_id: str, row: RoundRow) -> float:
    """When the round ends in simulated time: the previous round's end plus its slowest selected device's trip."""
    # torch: the clock reads the devices' data sizes
    from fedqueue.fl.strategy.trip_clock import run_clock

    clock = run_clock(config)
    previous = get_round(services.store, run_id, row.round_index - 1) if row.round_index > 1 else None
    began = (previous.sim_time or 0.0) if previous is not None else 0.0
    return began + max((clock.trip_seconds(row.round_index, device) for device in row.selected), default=0.0)


def _early_fold(services: Services, cache: WorkerCache | None, run_id: str, row: RoundRow) -> EarlyFold | None:
    """A FedAvg sum to fold the round's first updates into while its last devices train; None for other rules."""
    config = RunConfig.from_stored(services.store.get_run(run_id).config)
    # torch, as in aggregation
    from fedqueue.fl.ml.aggregate import SUMMABLE_RULES

    if config.plugin_names()["aggregate"] not in SUMMABLE_RULES:
        return None
    return EarlyFold(_round_model(services, cache, run_id, row), row.selected)


def _fedavg_of(
    services: Services,
    global_state: Mapping[str, torch.Tensor],
    updates: Sequence[StoredUpdate],
    ahead: ReadAhead,
    global_lr: float,
) -> dict[str, torch.Tensor]:
    """FedAvg over the round's updates (in device order), on from the sum begun in its tail where that holds
    the round's first updates."""
    from fedqueue.fl.ml.aggregate import FedAvgSum, fold_group

    resumed = ahead.early.resumed(updates) if ahead.early is not None else None
    folding, done = resumed if resumed is not None else (FedAvgSum(global_state), 0)
    rest = updates[done:]
    group = fold_group(global_state)
    # Each update is read as the fold reaches it (a few ahead): memory stays flat whatever the round's size.
    with _loaded(services, rest, ahead) as loaded:
        for first in range(0, len(rest), group):
            members = range(first, min(first + group, len(rest)))
            folding.fold([(loaded[position], rest[position].summed) for position in members])
    return folding.step(global_lr)


def _loaded(services: Services, stored: Sequence[StoredUpdate], ahead: ReadAhead) -> LoadedOnUse:
    """Updates as they are used: those read ahead from memory, the rest from the blob store, many per round trip."""
    # torch, as in aggregation
    from fedqueue.fl.ml.aggregate import LoadedOnUse

    refs = [update.ref for update in stored]

    def load_many(positions: Sequence[int]) -> list[Mapping[str, torch.Tensor]]:
        wanted = [refs[position] for position in positions]
        held = {ref.key: ahead.take(ref.key) for ref in wanted}
        missing = [ref for ref in wanted if held[ref.key] is None]
        fetched = dict(zip((ref.key for ref in missing), get_states(services.blobs, missing), strict=True))
        return [held[ref.key] or fetched[ref.key] for ref in wanted]  # a state is never empty

    return LoadedOnUse(
        [(update.device, update.samples) for update in stored],
        lambda position: load_many([position])[0],
        read_ahead=UPDATES_READ_AHEAD,
        load_many=load_many,
        chunk=blobs_per_read(refs),
    )


def start_next(services: Services, run_id: str, config: RunConfig, done_round: int, model: bytes | BlobRef) -> bool:
    """After a round is done: start the next one, or finish the run after the last (or where a stop rule
    ends it, recording the rule). Idempotent. `model`: the new version, or where it is published."""
    stop = stop_after(services, run_id, config, done_round)
    if stop is None:
        return start_round(services, run_id, config, done_round + 1, model)
    if not isinstance(model, BlobRef):
        publish_version(services, run_id, done_round, model)
    return finish_run(services, run_id, stop)


def finish_run(services: Services, run_id: str, stop: Stop) -> bool:
    """End the run on the rule that stopped it, once its last round is done."""
    record_stop(services.store, run_id, stop)
    keep_named_states(services.store, run_id)
    return services.store.finish_run(run_id, "finished")


def _after_closing(
    services: Services, run_id: str, round_index: int, published: BlobRef, encoded: bytes | memoryview
) -> None:
    """A round closed after the next one started: what that start could not count on yet."""
    # A broker that restarted empty while the checkpoint committed took the next round's model with it, and the
    # repair pass could not republish it from a checkpoint not yet in: the closer does it.
    if not services.blobs.exists(published.key):
        publish_version(services, run_id, round_index, bytes(encoded))
    # The next round's aggregation waits for this one to close, and gives its slot back past a while: a next
    # round already complete is requested again (forgotten first: its request may have found this one open).
    following = get_round(services.store, run_id, round_index + 1)
    if following is None or following.state != "training":
        return
    if count_done(services.store, run_id, round_index + 1) >= len(following.selected):
        services.ledger.forget_request(aggregate_key(run_id, round_index + 1))
        request_aggregation(services, run_id, round_index + 1)


def stop_after(
    services: Services, run_id: str, config: RunConfig, done_round: int, closing: Mapping[str, Any] | None = None
) -> Stop | None:
    """The rule that ends the run after round `done_round`, in FedRevive's order: the bound on rounds, then
    accuracy (read right after the round), then simulated time (the next round would end past it).
    `closing`: the metrics of `done_round` where its row does not hold them yet (its aggregator asks)."""
    rules = config.stop_rules()
    rows = [row for row in list_rounds(services.store, run_id) if row.round_index <= done_round]
    read = [(row.sim_time, row.accuracy) for row in rows]
    if closing is not None and rows and rows[-1].round_index == done_round:
        read[-1] = (closing.get("sim_time"), closing.get("accuracy"))
    sim_time = read[-1][0] if read else None
    accuracies = [accuracy for _, accuracy in read if accuracy is not None]
    last, best = (accuracies[-1], max(accuracies)) if accuracies else (None, None)
    within = services.store.get_run(run_id).rounds_total  # max_sim_time's bound, worked out at submit
    return (
        version_stop(rules, done_round, sim_time)
        or accuracy_stop(rules, done_round, sim_time, last, best)
        or (time_stop(rules, done_round, sim_time, None) if done_round >= within else None)
    )
