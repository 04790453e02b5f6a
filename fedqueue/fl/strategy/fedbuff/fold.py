"""Buffered asynchronous FL (FedBuff) on the queue: the fold pass that runs the schedule.

Workers train whatever device tasks are queued, as in synchronous rounds. The worker that stores
the result the fold waits for runs a fold pass right there (one pass per run at a time; a result
stored while one runs leaves a request that the pass takes on its way out). The pass holds the
run's schedule row, takes arrivals in simulated order as far as results are stored
(fedqueue.fl.strategy.fedbuff.schedule), makes each version that fills its buffer, sends refilled
devices off with the version current at that simulated instant, and saves the schedule.

A round row stands for a version: round r lists the devices sent off with version r - 1 and
closes when version r is made, so progress bars, status and the report read async runs as
they read rounds. A pass that dies is replayed from the last saved schedule: the same events,
the same weights; a task sent twice is stored once.
"""

from __future__ import annotations

import functools
import logging
import time
import uuid
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from fedqueue.core.broker.blobs import blobs_per_read, checked_blob
from fedqueue.core.codec import BlobRef
from fedqueue.core.services import Services
from fedqueue.errors import BlobIntegrityError
from fedqueue.fl.clock.stops import ACCURACY_RULES, Stop, accuracy_stop
from fedqueue.fl.config import RunConfig
from fedqueue.fl.messages import DeviceTask, FoldTask, fold_key, global_key
from fedqueue.fl.ml.weights import decode_state
from fedqueue.fl.packs.tasks import tasks_of_packs
from fedqueue.fl.store import schedule_rows
from fedqueue.fl.store.results import add_round, get_round
from fedqueue.fl.store.schema import RoundRow
from fedqueue.fl.store.states import keep_named_states
from fedqueue.fl.store.stop_rows import record_stop
from fedqueue.fl.strategy.common import ClaimLost, evaluate_version, renewing
from fedqueue.fl.strategy.fedbuff import schedule
from fedqueue.fl.strategy.fedbuff.rule import BUFFERED, VersionInputs, VersionRule
from fedqueue.fl.strategy.fedbuff.schedule import Arrival, Dispatch, NewVersion, Outcome, Rules, ScheduleState, Trip
from fedqueue.fl.strategy.fedbuff.section import FedBuffSection
from fedqueue.fl.worker.state_blobs import get_state, get_states, publish_state, recycle_states
from fedqueue.fl.worker.timing_rows import aggregation_timing

if TYPE_CHECKING:
    import torch
    from sqlalchemy.engine import Row

    from fedqueue.fl.worker.cache import WorkerCache

log = logging.getLogger(__name__)


def rules_of(config: RunConfig, rule: VersionRule = BUFFERED) -> Rules:
    """The schedule's rules of a run, as its strategy's version rule shapes them."""
    return rule.schedule(config, _config_rules(config))


def _config_rules(config: RunConfig) -> Rules:
    settings = config.strategy(FedBuffSection)
    return Rules(
        num_devices=config.num_devices,
        concurrency=settings.resolved_concurrency(config),
        buffer_size=settings.buffer_size,
        max_model_version=config.last_version,
        max_staleness=settings.max_staleness,
        min_refill=settings.min_refill,
        device_reuse=settings.device_reuse,
        seed=config.seed,
        staleness_weight=settings.staleness_weight,
        staleness_exponent=settings.staleness_exponent,
        pack_size=config.packing.resolved_size,
        staleness_s_max=settings.staleness_s_max,
        max_sim_time=config.max_sim_time,
        bound=config.stop_rules().bound,
    )


def _trip_seconds(config: RunConfig) -> schedule.TripTime:
    # torch only where the clock reads the devices' data sizes from a loaded partition (not fixed-size shards)
    from fedqueue.fl.strategy.trip_clock import run_clock

    return run_clock(config).trip_seconds


def start_buffered(
    services: Services, run_id: str, config: RunConfig, model: bytes, rule: VersionRule = BUFFERED
) -> None:
    """Publish version 0 and fill every slot at simulated time 0. Safe to call again (a repair pass)."""
    ref = _open_version(services, run_id, 0, model)
    state, dispatch = schedule.start(rules_of(config, rule), _trip_seconds(config))
    if dispatch is not None:
        _send(services, run_id, config, dispatch, ref)
    # Written after the tasks are sent: a start that dies between is started again, and a task sent twice is stored once.
    schedule_rows.create_schedule(services.store, run_id, state.to_dict(), state.version)
    publish_head(services, run_id, head_of(state))
    head = head_of(state)
    if head is not None and schedule_rows.stored_results(services.store, run_id, [head.round_index], [head.device]):
        # Its result came before the schedule it folds into: the pass it asked for found none, and its
        # request may still be marked. Ask again.
        services.ledger.forget_request(fold_key(run_id))
        request_fold(services, run_id)


def _open_version(services: Services, run_id: str, version: int, model: bytes) -> BlobRef:
    """Publish the first version (kept in the store too, while it is needed) and record the round that trains on it."""
    ref = services.blobs.put(global_key(run_id, version), model)
    schedule_rows.keep_version(services.store, run_id, version, ref.sha256, model)
    add_round(services.store, _round_on(run_id, version, ref))
    return ref


def _round_on(run_id: str, version: int, ref: BlobRef) -> RoundRow:
    """The round whose devices train on `version` (published as `ref`)."""
    return RoundRow(
        run_id=run_id,
        round_index=version + 1,
        version=version,
        state="training",
        selected=[],
        model_key=ref.key,
        model_sha256=ref.sha256,
        model_nbytes=ref.nbytes,
        enqueued_at=time.time(),
    )


def _send(services: Services, run_id: str, config: RunConfig, dispatch: Dispatch, model: BlobRef) -> None:
    schedule_rows.extend_selected(
        services.store, run_id, dispatch.round_index, [trip.device for trip in dispatch.trips]
    )
    services.enqueue(dispatch_tasks(run_id, config, dispatch.round_index, dispatch.packs(), model, time.time()))


def dispatch_tasks(
    run_id: str, config: RunConfig, round_index: int, packs: list[tuple[int, ...]], model: BlobRef, now: float
) -> list[DeviceTask]:
    # round_size is a synchronous round's: no fold pass reads it.
    return tasks_of_packs(run_id, round_index, config, packs, model, now, sum(len(pack) for pack in packs))


def head_key(prefix: str, run_id: str) -> str:
    """The trip (`round:device`) whose result lets a fold pass go on, named by the fold pass (a Redis key:
    running clusters hold it, so it never changes)."""
    return f"{prefix}:fold-head:{run_id}"


def _head_key(services: Services, run_id: str) -> str:
    return head_key(services.settings.key_prefix, run_id)


def _trip_name(round_index: int, device: int) -> str:
    return f"{round_index}:{device}"


_UNNAMED = object()  # no head published yet by this pass


def _trip_key(trip: Trip) -> tuple[int, int]:
    return trip.round_index, trip.device


def head_of(state: ScheduleState) -> Trip | None:
    """The first trip in simulated order, whose result the next fold step waits for (None once the run is done)."""
    return state.in_flight[0] if state.in_flight and not state.done else None


def publish_head(services: Services, run_id: str, head: Trip | None) -> None:
    """Name the first trip in simulated order: only its result lets a fold pass go on (None: any result may)."""
    key = _head_key(services, run_id)
    if head is not None:
        services.ledger.put_note(key, _trip_name(head.round_index, head.device))
    else:
        services.ledger.drop_note(key)


def on_result_stored(
    services: Services, task: DeviceTask, worker: str, cache: WorkerCache | None, rule: VersionRule = BUFFERED
) -> None:
    """Start a fold pass if the task holds the head trip, or if no head is known: here, in the worker
    that stored it (`cache` is its own), or as a fold task where the scheduler stored it.

    A result behind the head waits: the pass that the head's result starts takes it too. A head
    stored while a pass runs is seen by that pass (it looks once it has named the new head).
    """
    named = services.ledger.note(_head_key(services, task.run_id))
    if named is not None and named not in {_trip_name(task.round_index, device) for device in task.devices}:
        return
    if cache is None:
        request_fold(services, task.run_id)
    elif _mark_fold_request(services, task.run_id):
        fold_here(services, cache, task.run_id, worker, rule)


def fold_here(services: Services, cache: WorkerCache, run_id: str, worker: str, rule: VersionRule) -> None:
    """Run the fold pass just asked for in this worker: no fold task's trip through the broker and back.

    The request's mark is set, so a pass holding the schedule takes it on its way out. A pass that
    fails here is handed to a fold task, which tries again and counts the failures as any task's.
    """
    try:
        fold_updates(services, cache, run_id, worker, attempt=1, rule=rule)
    except Exception:  # whatever it was, the fold task's attempts decide whether the run fails
        log.exception("run %s: fold pass failed in the worker that asked for it; sent as a fold task", run_id)
        services.ledger.forget_request(fold_key(run_id))
        request_fold(services, run_id)


def _mark_fold_request(services: Services, run_id: str) -> bool:
    """Mark a fold pass asked for; False when one is asked for and not yet begun (it will see this result)."""
    return services.ledger.request_once(fold_key(run_id), within_s=2 * services.settings.heartbeat_ttl_s)


def request_fold(services: Services, run_id: str) -> bool:
    """Ask for a fold pass as a fold task, unless one is asked for and not yet begun."""
    if not _mark_fold_request(services, run_id):
        return False
    services.enqueue([FoldTask(run_id=run_id, enqueued_at=time.time())])
    return True


def fold_updates(
    services: Services, cache: WorkerCache, run_id: str, worker: str, attempt: int, rule: VersionRule = BUFFERED
) -> int:
    """Run fold passes while results keep asking for them, making versions by `rule` (the run's strategy's);
    returns the versions made.

    A pass that finds the schedule held by another returns at once: the holder looks for
    requests made while it worked once it lets go, and goes again if there is one.
    """
    key = fold_key(run_id)
    made = 0
    while True:
        owner = f"{worker}#{uuid.uuid4().hex[:8]}"
        stale_before = time.time() - services.settings.heartbeat_ttl_s
        held = schedule_rows.claim_schedule(services.store, run_id, owner, stale_before)
        if held is None:
            if services.store.get_run(run_id).state != "running":
                retire(services, run_id)  # a result stored after the end
                return made
            row = schedule_rows.get_schedule(services.store, run_id)
            if row is None:
                # Asked for before the run's schedule was written: the start asks again for a head stored by
                # then, and a head stored later asks for itself, as long as this request's mark is gone.
                services.ledger.forget_request(key)
                return made
            if row.claim_owner is None:
                continue  # written, or let go, since the claim was tried: try again
            return made  # held by a live pass: it looks for this request once it lets go
        services.ledger.forget_request(key)  # results stored from here on ask again
        try:
            renew = functools.partial(schedule_rows.renew_schedule, services.store, run_id, owner)
            with renewing(services, renew, f"run {run_id} fold") as lost:
                pass_ = _FoldPass(services, cache, run_id, owner, worker, attempt, lost.is_set, rule)
                made += pass_.run(ScheduleState.from_dict(held))
        except ClaimLost:
            log.warning("run %s: fold pass taken over by another worker; stopped", run_id)
            return made
        finally:
            schedule_rows.release_schedule(services.store, run_id, owner)
        if not services.ledger.is_requested(key):
            return made


READ_AHEAD = 64  # trips in flight, in simulated order, whose stored results one read of a fold pass looks up


class _Stored(dict[tuple[int, int], "Row[Any]"]):
    """The stored results a fold pass has read, by (round, device), and the trips it looked up: a trip looked up
    and not here had no stored result at that read."""

    def __init__(self) -> None:
        super().__init__()
        self.looked: set[tuple[int, int]] = set()


class _FoldPass:
    """One hold of a run's schedule: arrivals taken, versions made, devices sent, state saved."""

    def __init__(
        self,
        services: Services,
        cache: WorkerCache,
        run_id: str,
        owner: str,
        worker: str,
        attempt: int,
        claim_lost: Any,
        rule: VersionRule,
    ) -> None:
        self.services, self.cache, self.run_id, self.owner = services, cache, run_id, owner
        self.worker, self.attempt, self.claim_lost = worker, attempt, claim_lost
        self.config = cache.run_config(services, run_id)
        if rule.mode is not self.config.strategy_mode:
            raise RuntimeError(f"run {run_id}: a {rule.mode.name} version rule cannot fold a {self.config.mode} run")
        self.rule = rule
        self.rules = rules_of(self.config, rule)
        self.stops = self.config.stop_rules()
        self.trip_seconds = _trip_seconds(self.config)
        self._refs = cache.version_refs(run_id)  # published versions, by number, as this process has read or made them
        self._locals: dict[tuple[int, int], Mapping[str, torch.Tensor]] = {}
        # Versions made since the last save: recorded by that save, in its transaction.
        self._made: list[schedule_rows.MadeVersion] = []

    def run(self, state: ScheduleState) -> int:
        store = self.services.store
        made = 0
        results = self._results(state)
        named: object = _UNNAMED
        while not state.done and state.stuck is None:
            oldest = oldest_needed(state)
            teachers = teachers_needed(state)

            # A buffered update lost with Redis trains again: nothing moves until it is stored.
            complete = all(_trip_key(a.trip) in results for a in state.buffer)

            def outcome_of(trip: Trip, results: _Stored = results, complete: bool = complete) -> Outcome | None:
                if _trip_key(trip) not in results.looked:  # the head, past the trips read so far: read on
                    self._results(state, results)
                stored = results.get(_trip_key(trip))
                if stored is None or not complete:
                    return None
                return Outcome(ok=stored.state == "done", samples=stored.samples)

            # An accuracy stop is read once a version is evaluated: nothing moves past a version before that.
            events = schedule.advance(
                state, self.rules, self.trip_seconds, outcome_of, stop_after_version=self.stops.reads_accuracy
            )
            if events or state.done:  # a stop on simulated time may end the run with no event
                made += self._carry_out(state, events, results, teachers)
                if oldest_needed(state) > oldest:
                    self._forget_versions(oldest, oldest_needed(state))
            # Until the buffer is whole again, every stored result asks for a pass (no head is named).
            head = head_of(state) if complete else None
            if head != named:  # named once per pass at least; again only when it moved
                publish_head(self.services, self.run_id, head)
                named = head
            if not events or state.done:
                break
            # A head stored before it was named asked for no pass: this one takes it. The results of the
            # next arrivals, read once, say whether it is stored.
            results = self._results(state)
            if not state.in_flight or not self._may_take(state.in_flight[0], results):
                break
        if state.stuck is not None and store.finish_run(self.run_id, "failed", state.stuck):
            log.warning("run %s: %s", self.run_id, state.stuck)
        if state.done or state.stuck is not None:
            retire(self.services, self.run_id, state.version)
        return made

    def _may_take(self, head: Trip, results: Mapping[Any, Any]) -> bool:
        """The head's result is stored, or the run's simulated time ends before it arrives (no result needed)."""
        late = self.rules.max_sim_time is not None and head.arrives >= self.rules.max_sim_time
        return late or _trip_key(head) in results

    def _forget_versions(self, first: int, end: int) -> None:
        """Versions first..end-1 are never read again: unpublished (the pass's save, done by now, wrote the kept
        copies it needed from their files and dropped the rest). Their files are written over by the next
        states, pages in place, as a round's updates are (a fresh 45 MB file costs up to 20x the write)."""
        recycle_states(self.services.blobs, [global_key(self.run_id, version) for version in range(first, end)])
        for version in range(first, end):
            self._refs.pop(version, None)

    def _results(self, state: ScheduleState, stored: _Stored | None = None) -> _Stored:
        """Stored results of the next READ_AHEAD trips in flight, of those in the buffer (their versions are still
        to make), and of the remembered updates a version may read (FedRevive's teachers), added to `stored`.

        Arrivals are taken in order and a pass takes a few: the trips further on are read once it gets to them,
        so a read costs by the trips it may take, not by the devices in flight."""
        stored = _Stored() if stored is None else stored
        wanted = (
            state.in_flight[:READ_AHEAD] + [arrival.trip for arrival in state.buffer] + list(teachers_needed(state))
        )
        trips = [trip for trip in wanted if _trip_key(trip) not in stored.looked]
        rounds = {trip.round_index for trip in trips}
        devices = {trip.device for trip in trips}
        rows = schedule_rows.stored_results(self.services.store, self.run_id, rounds, devices)
        stored.update(((row.round_index, row.device), row) for row in rows)
        stored.looked.update(_trip_key(trip) for trip in trips)
        return stored

    def _carry_out(
        self,
        state: ScheduleState,
        events: list[schedule.Event],
        results: Mapping[Any, Any],
        teachers_before: frozenset[Trip],
    ) -> int:
        """Make the versions and send the devices the events say, then save the schedule."""
        store = self.services.store
        fates: list[dict[str, Any]] = []
        taken: list[str] = []
        abort = None
        made = 0
        sends: list[Dispatch] = []
        for event in events:
            if self.claim_lost():
                raise ClaimLost()
            if isinstance(event, Arrival):
                stored = results[_trip_key(event.trip)]
                if event.fate != "folded":  # a folded update's fate is written with the version it goes into
                    fates.append(_fate_row(event))
                if event.fate != "folded" and stored.update_key:
                    taken.append(stored.update_key)
                if event.fate == "failed" and self.config.on_failure == "abort":
                    reason = (stored.error or "").strip().splitlines()[-1:] or ["unknown error"]
                    abort = f"device {event.trip.device} failed ({reason[0]}) and on_failure = 'abort'"
            elif isinstance(event, NewVersion):
                taken += self._make_version(event, results, state)
                fates += [_fate_row(arrival) for arrival in event.folded]
                made += 1
                if state.done and state.stop is not None and state.stop.rule in ACCURACY_RULES:
                    break  # nothing trains on the last version: the refill at its instant is not sent
            else:
                sends.append(event)
        if state.done:
            # Nothing trains once the run has ended: a refill at the instant of its last version (a stop on
            # simulated time passes that instant before it knows) would train on a version never published.
            sends = []
        # Sent once every version they train on is published; before the save, so a pass that dies sends again.
        tasks = [
            task
            for dispatch in sends
            for task in dispatch_tasks(
                self.run_id,
                self.config,
                dispatch.round_index,
                dispatch.packs(),
                self._model_ref(dispatch.round_index - 1),
                time.time(),
            )
        ]
        selected: dict[int, list[int]] = {}
        for dispatch in sends:
            selected.setdefault(dispatch.round_index, []).extend(trip.device for trip in dispatch.trips)
        if tasks:
            # Their rounds and devices in the store first: a worker takes only tasks the store knows were sent.
            opened = [made.next_round for made in self._made if made.next_round is not None]
            schedule_rows.open_dispatches(store, self.run_id, opened, selected)
            self.services.enqueue(tasks)
        saved = schedule_rows.save_pass(
            store,
            self.run_id,
            self.owner,
            state.to_dict(),
            state.version,
            fates,
            selected,
            oldest_needed(state),
            self._made,
        )
        if not saved:
            raise ClaimLost()
        self._made = []
        if (
            self.rules.keep_recent
        ):  # a remembered update's model (FedRevive's teacher) is kept while a version may read it
            still = {_trip_key(t) for t in teachers_needed(state)}
            kept = {results[key].update_key for key in still if key in results}
            gone = [t for t in teachers_before if _trip_key(t) not in still]
            taken = [key for key in taken if key not in kept]
            taken += [results[_trip_key(t)].update_key for t in gone if _trip_key(t) in results]
        # The next updates are written over these files (a pass still reading them lost its claim: its save
        # fails); once the run is over they go.
        taken = list(dict.fromkeys(taken))
        if state.done or abort is not None:
            self.services.blobs.delete(taken)
        else:
            recycle_states(self.services.blobs, taken)
        self._end_if_over(state, abort)
        return made

    def _end_if_over(self, state: ScheduleState, abort: str | None) -> None:
        """Fail the run (a device failed under on_failure = "abort"), or finish it, naming its stop."""
        if abort is not None:
            self.services.store.finish_run(self.run_id, "failed", abort)
            state.done = True
        elif state.done:
            if state.stop is not None:
                record_stop(self.services.store, self.run_id, state.stop, self._final_evaluation(state))
            self.services.store.finish_run(self.run_id, "finished")

    def _final_evaluation(self, state: ScheduleState) -> dict[str, Any] | None:
        """A run ended by simulated time: its last version, made before the stop was known, is evaluated now
        unless eval_every already did (FedRevive evaluates once more at the stop)."""
        version = state.version
        if state.stop is None or state.stop.rule != "max_sim_time" or version == 0:
            return None
        row = get_round(self.services.store, self.run_id, version)
        if row is None or row.accuracy is not None:
            return None
        return evaluate_version(self.config, version, self._version_state(version), last=True) or None

    def _accuracy_stop(self, state: ScheduleState, event: NewVersion, metrics: Mapping[str, Any]) -> Stop | None:
        if "accuracy" in metrics:
            state.evaluated(float(metrics["accuracy"]))
        if state.done:
            return None  # the bound on versions ended it first, as in FedRevive's order
        return accuracy_stop(self.stops, event.version, event.at, state.last_accuracy, state.best_accuracy)

    def _server_state(self, version: int) -> bytes | None:
        for made in self._made:  # made in this pass, not saved yet
            if made.version == version:
                return made.server_state
        kept = schedule_rows.kept_version(self.services.store, self.run_id, version)
        return None if kept is None else kept.server_state

    def _local(self, results: Mapping[Any, Any], trip: Trip) -> Mapping[str, torch.Tensor]:
        """A folded update's trained weights (its update blob), read once per pass."""
        key = _trip_key(trip)
        if key not in self._locals:
            row = results[key]
            ref = BlobRef(key=row.update_key, sha256=row.update_sha256, nbytes=row.update_nbytes)
            self._locals[key] = get_state(self.services.blobs, ref)
        return self._locals[key]

    def _model_ref(self, version: int) -> BlobRef:
        if version not in self._refs:
            row = get_round(self.services.store, self.run_id, version + 1)
            if row is None:
                raise RuntimeError(f"run {self.run_id}: version {version} was never published")
            self._refs[version] = BlobRef(key=row.model_key, sha256=row.model_sha256, nbytes=row.model_nbytes)
        return self._refs[version]

    def _version_state(self, version: int) -> dict[str, torch.Tensor]:
        """A version's weights: from this process's cache or the broker, or, when a broker restarted empty lost
        it before the repair pass put it back, from the store's kept copy of it."""
        ref = self._model_ref(version)
        try:
            return self.cache.global_state(self.services, ref)
        except BlobIntegrityError:
            kept = schedule_rows.kept_version(self.services.store, self.run_id, version)
            if kept is None:
                raise
            log.warning("run %s: version %d not in the broker; read from the store", self.run_id, version)
            state = decode_state(checked_blob(ref, bytes(kept.data)))
            self.cache.keep_global_state(ref, state)
            return state

    def _make_version(self, event: NewVersion, results: Mapping[Any, Any], state: ScheduleState) -> list[str]:
        """Fold the buffer into the next version, evaluate, checkpoint and publish it; returns the updates used."""
        # torch: loaded by the worker that folds, not by the command line
        from fedqueue.fl.ml.stat_resnet import reset_trackers
        from fedqueue.fl.ml.torch_device import device_label

        started_at, clock = time.time(), time.perf_counter()
        stored = [results[_trip_key(a.trip)] for a in event.folded]

        refs = [BlobRef(key=row.update_key, sha256=row.update_sha256, nbytes=row.update_nbytes) for row in stored]
        chunk = blobs_per_read(refs)

        def buffer() -> Iterator[tuple[float, Mapping[str, torch.Tensor], Mapping[str, torch.Tensor]]]:
            # Read in round trips of a few updates (many small ones, few big ones): memory stays flat.
            for start in range(0, len(refs), chunk):
                read = get_states(self.services.blobs, refs[start : start + chunk])
                for arrival, update in zip(event.folded[start : start + chunk], read, strict=True):
                    yield arrival.weight, self._version_state(arrival.trip.base_version), update

        made = self.rule.make(
            VersionInputs(
                config=self.config,
                event=event,
                current=self._version_state(event.version - 1),
                version_of=self._version_state,
                local_of=functools.partial(self._local, results),
                buffer=buffer,
                server_state_of=self._server_state,
                run_id=self.run_id,
                cache=self.cache,
            )
        )
        # FedRevive: a new version carries no feature statistics of its own (a no-op without trackers).
        new_state = reset_trackers(made.state)
        metrics: dict[str, Any] = {"aggregate_ms": (time.perf_counter() - clock) * 1000, "sim_time": event.at}
        losses = [row.loss for row in stored if row.loss is not None]
        if losses:
            # A plain mean, where a synchronous round's is weighted by samples (sync/rounds.py): each reports
            # the loss of the updates as its version weighs them. FedAvg weighs a device by its samples;
            # FedBuff (and FLARE's edge manager) divide the buffer's sum by its count, whatever the samples.
            metrics["train_loss"] = float(np.mean(losses))
        bounded = state.done and state.stop is not None and state.stop.version == event.version
        metrics.update(evaluate_version(self.config, event.version, new_state, last=bounded))
        stop = self._accuracy_stop(state, event, metrics)
        if stop is not None:
            state.end(stop)
        # Timed from the version's start: no task was queued for it, a fold pass makes it on its way.
        timing = aggregation_timing(
            self.run_id,
            event.version,
            started_at,
            "done",
            self.worker,
            self.attempt,
            device_label(),
            started_at,
            compute_ms=(time.perf_counter() - clock) * 1000,
        )
        # Published first, recorded with the save: a pass that dies in between publishes the same bytes again.
        # Hashed as it is written; the save reads its bytes back from there.
        ref, encoded = publish_state(self.services.blobs, global_key(self.run_id, event.version), new_state)
        last = bounded or stop is not None
        next_round = None if last else _round_on(self.run_id, event.version, ref)
        # Recorded by the pass's save, with the schedule that made it: one transaction, not two.
        self._made.append(
            schedule_rows.MadeVersion(
                event.version, ref.sha256, encoded, metrics, next_round, timing, made.server_state
            )
        )
        if not last:
            self._refs[event.version] = ref
            self.cache.keep_global_state(ref, new_state)  # this process serves it from memory, never reads it back
        log.info("run %s: version %d made from %d updates", self.run_id, event.version, len(stored))
        return [row.update_key for row in stored if row.update_key]


def retire(services: Services, run_id: str, last_version: int | None = None) -> None:
    """The run has ended on `last_version` (default: the schedule's): unpublish its versions, so devices
    still queued skip their training, and drop the updates no pass will take."""
    if last_version is None:
        row = schedule_rows.get_schedule(services.store, run_id)
        last_version = 0 if row is None else row.version
    services.blobs.delete([global_key(run_id, version) for version in range(last_version)])
    schedule_rows.forget_versions_before(services.store, run_id, last_version + 1)
    keep_named_states(services.store, run_id)
    services.blobs.delete(schedule_rows.untaken_update_keys(services.store, run_id))


def teachers_needed(state: ScheduleState) -> frozenset[Trip]:
    """The folded trips whose models a version may still read: those its rule remembers (FedRevive's teachers;
    none in FedBuff)."""
    return frozenset(state.recent).union(*(arrival.recent for arrival in state.buffer))


def oldest_needed(state: ScheduleState) -> int:
    """The oldest version a device in flight or in a forming pack trains on or a buffered update came from (or
    the current one).

    Published versions older than this are never read again.
    """
    waiting = state.in_flight + state.forming
    needed = [trip.base_version for trip in waiting] + [a.trip.base_version for a in state.buffer]
    return min(needed, default=state.version)


def _fate_row(arrival: Arrival) -> dict[str, Any]:
    return {
        "round_index": arrival.trip.round_index,
        "device": arrival.trip.device,
        "sim_dispatched": arrival.trip.dispatched,
        "sim_arrived": arrival.trip.arrives,
        "fate": arrival.fate,
        "staleness": arrival.staleness,
        "weight": arrival.weight,
        "folded_into": arrival.version if arrival.fate == "folded" else None,
    }
