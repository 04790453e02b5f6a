"""What a worker does with one lane task: claim a batch of pending calls, generate them, advance their items by
replay and store it all in one transaction, then send the lane's next task. No Celery.

No barrier between steps: an item whose call is stored has its next call pending at once, for whichever lane
claims next, while other items are still in theirs. A lane with nothing to claim waits briefly for another
lane's batch to store new calls, then passes its turn on.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from fedqueue.core.services import Services
from fedqueue.core.timing import timing_of
from fedqueue.llm.backends import registry as backends
from fedqueue.llm.converted import cache_root
from fedqueue.llm.messages import KIND_NAME
from fedqueue.llm.pipelines.config import PipelineConfig
from fedqueue.llm.pipelines.messages import PipelineLane
from fedqueue.llm.pipelines.program import load_program
from fedqueue.llm.pipelines.replay import Advance, Failed, NextCall, advance
from fedqueue.llm.pipelines.request import Generate
from fedqueue.llm.pipelines.rows import (
    CallOutcome,
    claim,
    fail_claimed,
    item_states,
    items_running,
    lane_seq,
    move_lane,
    store_batch,
)
from fedqueue.llm.schema import PipelineCallRow
from fedqueue.llm.wake import announce_stored
from fedqueue.llm.worker import ModelCache

if TYPE_CHECKING:
    from fedqueue.llm.model import LoadedModel

log = logging.getLogger(__name__)

IDLE_WAIT_S = 2.0  # how long a lane with nothing to claim waits for new calls before passing its turn on


def calls_key(prefix: str, run_id: str, lane: int) -> str:
    """The list that wakes an idle lane when another stores new calls."""
    return f"{prefix}:llm-pipe-calls:{run_id}:{lane}"


def run_lane(services: Services, cache: ModelCache, task: PipelineLane, worker: str, attempt: int = 1) -> None:
    store = services.store
    if store.get_run(task.run_id).state != "running":  # finished, or cancelled
        return
    if lane_seq(store, task.run_id, task.lane) != task.seq:
        log.info("%s: stored by an earlier delivery; skipped", task.label)
        return
    config = PipelineConfig.of_run(cache.job(services, task.run_id))
    calls = claim(store, task.run_id, task.lane, config.batch_size, config.lanes)
    if not calls and items_running(services.store, task.run_id):
        services.ledger.wait_for_wake(calls_key(services.settings.key_prefix, task.run_id, task.lane), IDLE_WAIT_S)
        calls = claim(store, task.run_id, task.lane, config.batch_size, config.lanes)
    if not calls:
        if move_lane(store, task.run_id, task.lane, task.seq):
            _follow_on(services, task)
        return
    started_at = time.time()  # its batch claimed: a lane's wait for calls to claim is not its work
    clock = time.perf_counter()
    loaded = _model(services, cache, config)
    load_ms = _elapsed_ms(clock)
    clock = time.perf_counter()
    outcomes = generate_calls(services, cache, config, calls)
    compute_ms = _elapsed_ms(clock)
    clock = time.perf_counter()
    advances = advance_items(config, task.run_id, services, calls, outcomes)
    # A batch's row of the timing table, as a batch job's: the report's timeline and utilization read it.
    timing = timing_of(
        task,
        kind=KIND_NAME,
        task_type="generate",
        task=f"{task.task_name} task {task.seq}",
        round_index=None,
        state="done",
        worker=worker,
        attempt=attempt,
        device_used=str(loaded.device),
        started_at=started_at,
        load_ms=load_ms,
        compute_ms=compute_ms,
        upload_ms=_elapsed_ms(clock),  # the programs' replay to their next calls
    )
    if store_batch(store, task.run_id, task.lane, task.seq, worker, outcomes, advances, timing):
        for lane in range(config.lanes):
            if lane != task.lane:
                services.ledger.wake(calls_key(services.settings.key_prefix, task.run_id, lane))
        announce_stored(services, task.run_id)
        _follow_on(services, task)


def give_up_lane(services: Services, task: PipelineLane, error: str) -> None:
    """A lane task that failed every attempt: the items whose calls it held fail with its error; the lane goes on."""
    reason = next((line for line in reversed(error.strip().splitlines()) if line.strip()), error)
    fail_claimed(services.store, task.run_id, task.lane, f"{task.label} failed every attempt: {reason}")
    if move_lane(services.store, task.run_id, task.lane, task.seq):
        _follow_on(services, task)
    announce_stored(services, task.run_id)


def generate_calls(
    services: Services, cache: ModelCache, config: PipelineConfig, calls: Sequence[PipelineCallRow]
) -> list[CallOutcome]:
    """Each call's output, in the calls' order; calls with other decoding settings run as batches of their own."""
    backend = backends.get(config.generation.backend)
    loaded = _model(services, cache, config)
    from fedqueue.llm.generate import PromptIn  # loaded by cache.model, under its lock

    groups: dict[Any, list[tuple[int, Generate]]] = {}
    for index, call in enumerate(calls):
        request = Generate.from_dict(call.request)
        groups.setdefault(request.settings(config.generation), []).append((index, request))
    found: dict[int, CallOutcome] = {}
    for settings, members in groups.items():
        # The key seeds sampling: each item and step draws from its own generator.
        prompts = [
            PromptIn(key=f"{calls[index].item_key}#{calls[index].step}", prompt=request.prompt, messages=request.pairs)
            for index, request in members
        ]
        generations, _ = backend.generate(loaded, prompts, settings)
        for (index, _), generation in zip(members, generations, strict=True):
            found[index] = CallOutcome(
                item_key=calls[index].item_key,
                step=calls[index].step,
                output=generation.output,
                prompt_tokens=generation.prompt_tokens,
                generated_tokens=generation.generated_tokens,
                finish_reason=generation.finish_reason,
                error=generation.error,
            )
    return [found[index] for index in range(len(calls))]


def _model(services: Services, cache: ModelCache, config: PipelineConfig) -> LoadedModel:
    """The run's model, loaded once per worker process (the cache's)."""
    backend = backends.get(config.generation.backend)
    return cache.model(config.model, config.generation.dtype, backend, cache_root(services.settings.model_cache))


def _elapsed_ms(began: float) -> float:
    return (time.perf_counter() - began) * 1000


def advance_items(
    config: PipelineConfig,
    run_id: str,
    services: Services,
    calls: Sequence[PipelineCallRow],
    outcomes: Sequence[CallOutcome],
) -> dict[str, tuple[Advance, int]]:
    """Each item's next call (with its length) or end, replaying its program over its stored outputs and this one."""
    program = load_program(config.program)
    states = item_states(services.store, run_id, [call.item_key for call in calls])
    advances: dict[str, tuple[Advance, int]] = {}
    for call, outcome in zip(calls, outcomes, strict=True):
        item, done = states[call.item_key]
        found: Advance
        if outcome.error is not None:
            found = Failed(call.step, f"step {call.step}: generation failed: {outcome.error}")
        elif [stored.step for stored in done] != list(range(call.step)):
            found = Failed(call.step, f"step {call.step}: the steps before it are not all stored")
        else:
            outputs = [str(stored.output) for stored in done] + [str(outcome.output)]
            requests = [stored.request for stored in done] + [call.request]
            found = advance(program, item.item, outputs, config.max_steps, requests)
        advances[call.item_key] = (found, config.length(found.request) if isinstance(found, NextCall) else 0)
    return advances


def _follow_on(services: Services, task: PipelineLane) -> None:
    """The lane's next task while items are running; the run finished after its last item."""
    if items_running(services.store, task.run_id):
        services.enqueue([task.next(time.time())])
    elif services.store.finish_run(task.run_id, "finished"):
        log.info("pipeline %s: every item stored; finished", task.run_id)
        for lane in range(PipelineConfig.of_run(services.store.get_run(task.run_id).config).lanes):
            services.ledger.wake(calls_key(services.settings.key_prefix, task.run_id, lane))
        announce_stored(services, task.run_id)
