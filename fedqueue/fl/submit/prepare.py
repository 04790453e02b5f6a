"""What a submit computes with torch: the plugins checked, the data and version 0 of the model built, the packing
chosen (the pack trial). Either here, or away from a command that then follows the run for its whole length
(`fedqueue run`), so that it never loads torch, the few hundred MB of memory it would otherwise hold until the
end, for nothing it does after the submit (`apart`): by a running worker, which has torch loaded already and
answers in a fraction of a second (`prepare_on_worker`), else in a fresh process that exits once it has
answered (`prepare_apart`), which spends seconds importing torch. The answer is the same either way.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import Any

from fedqueue.core.services import AskWorkers
from fedqueue.fl.config import RunConfig

PREPARE_QUESTION = "fedqueue.fl.prepare"


@dataclass(frozen=True)
class Prepared:
    """The config as the run will be stored (its packing resolved) and its version 0, encoded."""

    config: RunConfig
    state: bytes


def prepare(config: RunConfig, worker_slots: Callable[[], dict[str, int]]) -> Prepared:
    """The submit's torch work in this process."""
    from fedqueue.fl.ml.data import load_federated
    from fedqueue.fl.ml.models import initial_state
    from fedqueue.fl.ml.weights import encode_state
    from fedqueue.fl.packs.trial import resolve_packing
    from fedqueue.fl.setup import call_plugin, check_plugins, data_spec

    check_plugins(config)
    data = call_plugin("dataset", config.data.dataset, load_federated, data_spec(config))
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
    return Prepared(resolve_packing(config, data, worker_slots), encode_state(state))


def prepare_on_worker(
    ask_workers: AskWorkers, config: RunConfig, worker_slots: Callable[[], dict[str, int]]
) -> Prepared | None:
    """prepare() by a running worker; None where none answered (none took it in time, or it failed there: the
    caller prepares apart, and meets the same error with its own message)."""
    slots = worker_slots() if config.packing.needs_workers else {}
    answer = ask_workers(PREPARE_QUESTION, {"config": config.to_dict(), "slots": slots})
    if answer is None:
        return None
    resolved, state = answer
    return Prepared(RunConfig.from_dict(resolved["config"]), state)


def answer_prepare(question: dict[str, Any]) -> tuple[dict[str, Any], bytes]:
    """A worker's side of `prepare_on_worker`."""
    config, state = _prepare_raw(question["config"], question["slots"])
    return {"config": config}, state


def prepare_apart(config: RunConfig, worker_slots: Callable[[], dict[str, int]]) -> Prepared:
    """prepare() in a fresh process (spawned: this one's imports and threads stay here), the same answer.
    The workers are asked here, and only where the packing is "auto", as prepare() asks them."""
    slots = worker_slots() if config.packing.needs_workers else {}
    with ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn")) as pool:
        resolved, state = pool.submit(_prepare_raw, config.to_dict(), slots).result()
    return Prepared(RunConfig.from_dict(resolved), state)


def _prepare_raw(raw: dict[str, Any], slots: dict[str, int]) -> tuple[dict[str, Any], bytes]:
    prepared = prepare(RunConfig.from_dict(raw), lambda: slots)
    return prepared.config.to_dict(), prepared.state
