"""The pack trial at submit: "auto" pack size and mode chosen for a run, and a vmapped pack tried once.

The choice is written into the run's config, so every worker packs alike. Timing happens in the
submitting process on its CPU (remembered per machine and config, fedqueue.fl.packs.cache); GPU
workers get a rule, since this process must not touch CUDA.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import replace

import torch
from torch import nn

from fedqueue.config import Settings
from fedqueue.core.broker.shm import shm_base
from fedqueue.errors import ConfigError
from fedqueue.fl.config import RunConfig
from fedqueue.fl.ml.data import FederatedData, device_data
from fedqueue.fl.ml.models import build_model
from fedqueue.fl.ml.pack_train import StackedPack, train_pack, vmap_refusal
from fedqueue.fl.ml.train import local_schedule, train_local
from fedqueue.fl.ml.trial_update import TrialUpdate
from fedqueue.fl.ml.weights import encode_state, write_state
from fedqueue.fl.packs import cache as pack_cache
from fedqueue.fl.packs.rules import (
    PACKS_PER_SLOT,
    auto_pack_mode,
    auto_pack_size,
    has_gpu_workers,
    measured_pack_mode,
    total_slots,
)
from fedqueue.fl.packs.section import AUTO
from fedqueue.fl.setup import data_spec, resolve_plugins, train_config

PackTimer = Callable[[RunConfig, FederatedData, int], tuple[float, float]]


def resolve_packing(
    config: RunConfig,
    data: FederatedData,
    worker_slots: Callable[[], dict[str, int]],
    timer: PackTimer | None = None,
) -> RunConfig:
    """The config with "auto" pack size and mode chosen (and the choice noted), checked for vmap; else as given."""
    packing = config.packing
    if not packing.needs_workers:
        check_pack_mode(config, data)
        return config
    workers = worker_slots()
    notes = []
    size = packing.pack_size
    if not isinstance(size, int):
        slots = total_slots(workers) if workers else os.cpu_count() or 1
        size = auto_pack_size(config.devices_per_round, slots)
        found = f"{slots} slots" if workers else f"no worker answered, {slots} slots assumed (one per core here)"
        notes.append(f"pack_size {size}: {config.devices_per_round} devices, {found}, {PACKS_PER_SLOT} packs per slot")
    mode = packing.pack_mode
    if mode == AUTO and size == 1:
        mode = "sequential"
        notes.append("pack_mode sequential: one device per task")
    elif mode == AUTO:
        mode, why = _auto_mode(config, data, max(size, 2), has_gpu_workers(workers), timer or time_pack_modes)
        notes.append(f"pack_mode {mode}: {why}")
    resolved = config.with_keys(pack_size=size, pack_mode=mode, pack_choice="; ".join(notes))
    if packing.pack_mode != AUTO:  # an "auto" mode was tried as vmap above: no second trial
        check_pack_mode(resolved, data)
    return resolved


def _auto_mode(config: RunConfig, data: FederatedData, pack: int, on_gpu: bool, timer: PackTimer) -> tuple[str, str]:
    """(mode, why) for packs of `pack`: timed here for CPU workers (once per machine and config), by rule
    for GPU workers (this process must not touch CUDA); sequential where vmap is refused."""
    key = None if on_gpu else pack_cache.cache_key(config, pack)
    earlier = None if key is None else pack_cache.remembered(key)
    if earlier is not None:
        return earlier[0], f"{earlier[1]} (remembered from an earlier submit on this machine)"
    try:
        check_pack_mode(config.with_keys(pack_size=pack, pack_mode="vmap"), data)
        refused = None
    except ConfigError as err:
        refused = str(err).removeprefix("pack_mode: ").split(";")[0]
    if refused is None and not on_gpu:  # a CPU like the workers' is here to time both ways on
        mode, why = measured_pack_mode(*timer(config, data, pack), presums=_presums_packs(config))
    else:
        mode, why = auto_pack_mode(_has_convolution(config, data), on_gpu, refused)
    if key is not None:
        pack_cache.remember(key, mode, why)
    return mode, why


TIMED_PACK_MAX = 16  # devices timed: a larger pack's time per device differs little, and timing it delays the submit
TIMING_BUDGET_S = 0.05  # per timing of one way: the steps timed are cut to fit it
TIMINGS = 3  # each way timed up to this often, alternating; the fastest counts (noise only ever slows a run down)
TIMINGS_BUDGET_S = 1.0  # all timings together: a model whose step is slow is timed fewer times (twice at least)


def time_pack_modes(config: RunConfig, data: FederatedData, pack: int) -> tuple[float, float]:
    """Seconds per device of its local update, one pack of up to `pack` devices trained back to back and
    vmapped, on this process's CPU with one torch thread (as a worker slot trains): the steps timed, scaled
    to the run's local steps, plus what each way does with the trained weights before they leave
    (`_state_seconds`). The optimizer's update is a stand-in that does its work without importing
    torch.optim's machinery (fedqueue.fl.ml.trial_update)."""

    devices = list(range(min(pack, config.num_devices, TIMED_PACK_MAX)))
    spec = data_spec(config)
    plugins = resolve_plugins(config)
    full = train_config(config)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with torch.random.fork_rng(devices=[]):
            model = build_model(config.model, data.input_shape, data.num_classes, config.plugin)
            datas = [device_data(spec, device) for device in devices]

            cpu = torch.device("cpu")

            def loop(steps: int) -> None:
                trial = replace(full, local_iters=steps, local_epochs=None)
                for device, samples in zip(devices, datas, strict=True):
                    train_local(model, samples, trial, device, cpu, plugins.local_step, plugins.options, TrialUpdate)

            trained: list[StackedPack] = []

            def stacked(steps: int) -> None:
                trial = replace(full, local_iters=steps, local_epochs=None)
                trained[:] = [
                    train_pack(model, datas, trial, devices, cpu, plugins.local_step, plugins.options, TrialUpdate)
                ]

            # One untimed step each (vmap traces its function on the first call) sizes the steps timed.
            first = max(_seconds(loop, 1), _seconds(stacked, 1))
            most = max(local_schedule(len(samples), full)[1] for samples in datas)
            steps = max(1, min(most, int(TIMING_BUDGET_S / first) if first > 0 else most))
            repeats = max(2, min(TIMINGS, int(TIMINGS_BUDGET_S / (2 * first * steps)) if first > 0 else TIMINGS))
            sequential, vmapped = [], []
            for _ in range(repeats):
                sequential.append(_seconds(loop, steps))
                vmapped.append(_seconds(stacked, steps))
            per_step = steps * len(devices)
            run_steps = sum(local_schedule(len(samples), full)[1] for samples in datas) / len(datas)
            alone, together = _state_seconds(model.state_dict(), trained[0], _presums_packs(config))
            return (
                min(sequential) / per_step * run_steps + alone,
                min(vmapped) / per_step * run_steps + together,
            )
    finally:
        torch.set_num_threads(threads)


def _state_seconds(state: dict[str, torch.Tensor], pack: StackedPack, presums: bool) -> tuple[float, float]:
    """Seconds per device from trained weights to the blob uploaded, (back to back, vmapped).

    Back to back, each device's state leaves as a blob. A vmapped pack's weights are taken apart into one
    state per device, each a blob, or, where the run sums a pack where it trained (FedAvg), summed in float64
    and that one sum, twice a state's bytes, a blob. A blob is what a worker makes of it: in shared memory
    where this host has it (workers on one host hand blobs over that way), a file written over one a folded
    update left; else the bytes encoded and hashed for the broker. For a model of millions of parameters
    these cost as much as a few steps; for a small one nothing.
    """
    folder = _shared_memory()
    with tempfile.TemporaryDirectory(dir=folder, prefix="fedqueue-trial-") if folder else nullcontext() as trial:
        path = None if trial is None else os.path.join(trial, "state")

        def blob(weights: dict[str, torch.Tensor]) -> None:
            if path is None:
                hashlib.sha256(encode_state(weights)).digest()
                return
            with open(path, "r+b") as out:
                write_state(weights, out)
                out.truncate()

        def unstacked() -> None:
            for outcome in pack.outcomes():
                blob(outcome.state)

        if path is not None:
            with open(path, "wb") as out:  # untimed: the file a folded update left, its pages in place
                write_state(state, out)
        alone = _timed(lambda: blob(state))
        together = _timed(lambda: blob(pack.weighted_delta_sum())) if presums else _timed(unstacked)
    return alone, together / len(pack.samples)


def _shared_memory() -> str | None:
    """The folder a worker on this host writes its blobs into, where blobs use shared memory."""
    try:
        settings = Settings.from_env()
    except ConfigError:  # refused where the command or worker started: timed as blobs for the broker here
        return None
    base = shm_base(settings)
    return None if base is None else str(base)


def _presums_packs(config: RunConfig) -> bool:
    """Whether a vmapped pack of this run uploads one pre-summed update (as its device task decides)."""
    # The strategies import the packs' task cutting: asked here, when a run is submitted.
    from fedqueue.fl.ml.aggregate import SUMMABLE_RULES
    from fedqueue.fl.strategy.registry import strategy_for

    return config.plugin_names()["aggregate"] in SUMMABLE_RULES and strategy_for(config).presums_packs


def _timed(work: Callable[[], None]) -> float:
    started = time.thread_time()
    work()
    return time.thread_time() - started


def _seconds(train: Callable[[int], None], steps: int) -> float:
    """CPU seconds of this thread (torch runs on it with one thread): workers booting beside the submit,
    or any other process, take the CPU away without counting here."""
    return _timed(lambda: train(steps))


def _has_convolution(config: RunConfig, data: FederatedData) -> bool:

    model = build_model(config.model, data.input_shape, data.num_classes, config.plugin)
    return any(isinstance(module, nn.modules.conv._ConvNd) for module in model.modules())


def check_pack_mode(config: RunConfig, data: FederatedData) -> None:
    """Refuse a vmapped run whose model or local step cannot train in a stacked pack, in one line.

    The model is inspected, then the step is tried once on two devices, as a worker would run it.
    """
    if config.packing.pack_mode != "vmap" or config.packing.pack_size == 1:
        return

    advice = 'use pack_mode = "sequential"'
    model = build_model(config.model, data.input_shape, data.num_classes, config.plugin)
    refusal = vmap_refusal(model)
    if refusal is not None:
        raise ConfigError(f"pack_mode: vmap cannot train this model: {refusal}; {advice}")
    spec = data_spec(config)
    trial = replace(train_config(config), local_iters=1, local_epochs=None)
    devices = list(range(min(2, config.num_devices)))
    plugins = resolve_plugins(config)
    try:
        with torch.random.fork_rng(devices=[]):
            datas = [device_data(spec, device) for device in devices]
            cpu = torch.device("cpu")
            train_pack(model, datas, trial, devices, cpu, plugins.local_step, plugins.options, TrialUpdate)
    except Exception as err:  # whatever the step does under vmap, the user gets one line and the advice
        reason = (str(err).strip().splitlines() or [""])[0][:200]
        raise ConfigError(
            f"pack_mode: local_step {config.training.local_step!r} cannot run under vmap ({type(err).__name__}: {reason}); "
            f"{advice}"
        ) from None
