"""The baseline of bench/data_plane.py: a run's FL work as a plain loop in one process, one torch thread.

One model, built once; per device: load the global state, train (fedqueue's own `train_local`, seeds
and data), keep the update; per round or version: fold (fedqueue's own `fedavg`, or `fold_buffer` for
FedBuff with every update fresh), then reset FedRevive's feature statistics as fedqueue's aggregation
does. Nothing is encoded, hashed or copied through Redis: what fedqueue adds to this is its data plane
and its scheduling.

`side_by_side` runs copies of the loop at once, one process each: how much of two cores' speed the machine
gives to the same work in two processes (memory bandwidth and caches are shared), the floor measured.
"""

from __future__ import annotations

import multiprocessing
import time
from dataclasses import dataclass, field
from typing import Any

from fedqueue.fl.config import RunConfig

State = dict[str, Any]


@dataclass
class LoopRun:
    """Seconds of each round (sync) or version (FedBuff), updates folded in each, and the final state."""

    seconds: list[float] = field(default_factory=list)
    cpu_seconds: list[float] = field(default_factory=list)  # this process's, so the machine's load aside
    updates: list[int] = field(default_factory=list)
    train_ms: list[float] = field(default_factory=list)  # each device's training alone
    state: State | None = None

    def timed(self) -> tuple[float, int]:
        """Seconds and updates of the timed part: all but the first (warm-up) and the last round."""
        return sum(self.seconds[1:-1]), sum(self.updates[1:-1])

    def timed_cpu_ms(self) -> float:
        """CPU milliseconds per update of the timed part."""
        return 1000 * sum(self.cpu_seconds[1:-1]) / sum(self.updates[1:-1])


class Loop:
    def __init__(self, config: RunConfig) -> None:
        import torch

        from fedqueue.fl.ml import aggregate
        from fedqueue.fl.ml.data import load_federated
        from fedqueue.fl.ml.models import build_model, initial_state
        from fedqueue.fl.setup import data_spec, resolve_plugins, train_config

        # The loop is the one-thread baseline: its fold too (fedqueue's aggregation splits it over the cores).
        aggregate.AGGREGATION_THREADS = 1

        self.config = config
        self.spec = data_spec(config)
        federated = load_federated(self.spec)
        shape, classes = federated.input_shape, federated.num_classes
        self.model = build_model(config.model, shape, classes, config.plugin)
        self.initial = initial_state(config.model, shape, classes, config.seed, config.plugin)
        self.plugins = resolve_plugins(config)
        self.train_cfg = train_config(config)
        self.device = torch.device("cpu")

    def train(self, state: State, round_index: int, device: int, run: LoopRun) -> tuple[int, int, State]:
        from fedqueue.fl.ml.data import device_data
        from fedqueue.fl.ml.seeding import task_seed
        from fedqueue.fl.ml.train import train_local

        self.model.load_state_dict(state)
        began = time.perf_counter()
        outcome = train_local(
            self.model,
            device_data(self.spec, device),
            self.train_cfg,
            task_seed(self.config.seed, round_index, device),
            self.device,
            self.plugins.local_step,
            self.plugins.options,
        )
        run.train_ms.append((time.perf_counter() - began) * 1000)
        return device, outcome.samples, outcome.state

    def sync(self) -> LoopRun:
        """FedAvg rounds, the devices fedqueue's scheduler selects."""
        from fedqueue.fl.ml.aggregate import fedavg
        from fedqueue.fl.ml.stat_resnet import reset_trackers
        from fedqueue.fl.strategy.sync.rounds import select_devices

        config, run, state = self.config, LoopRun(), self.initial
        for round_index in range(1, config.rounds + 1):
            began, cpu = time.perf_counter(), time.process_time()
            devices = select_devices(config.seed, round_index, config.num_devices, config.devices_per_round)
            updates = [self.train(state, round_index, device, run) for device in devices]
            state = reset_trackers(fedavg(state, updates, config.global_lr))
            run.seconds.append(time.perf_counter() - began)
            run.cpu_seconds.append(time.process_time() - cpu)
            run.updates.append(len(updates))
        run.state = state
        return run

    def fedbuff(self) -> LoopRun:
        """A version every `buffer_size` updates, each trained on the version before (nothing stale)."""
        from fedqueue.fl.ml.aggregate import fold_buffer
        from fedqueue.fl.ml.stat_resnet import reset_trackers
        from fedqueue.fl.strategy.fedbuff.section import FedBuffSection

        config, run, state = self.config, LoopRun(), self.initial
        buffer_size = config.strategy(FedBuffSection).buffer_size
        versions = config.last_version or config.rounds
        for version in range(1, versions + 1):
            began, cpu = time.perf_counter(), time.process_time()
            first = (version - 1) * buffer_size
            devices = [(first + offset) % config.num_devices for offset in range(buffer_size)]
            updates = [self.train(state, version, device, run)[2] for device in devices]
            state = reset_trackers(fold_buffer(state, [(1.0, state, local) for local in updates], config.global_lr))
            run.seconds.append(time.perf_counter() - began)
            run.cpu_seconds.append(time.process_time() - cpu)
            run.updates.append(len(updates))
        run.state = state
        return run


def run_mode(loop: Loop, mode: str) -> LoopRun:
    return loop.sync() if mode == "fedavg" else loop.fedbuff()


def _timed_copy(config: dict[str, Any], mode: str, ready: Any) -> tuple[float, int]:
    import torch

    torch.set_num_threads(1)
    loop = Loop(RunConfig.from_dict(config))
    ready.wait()  # every copy built and warm before any is timed
    return run_mode(loop, mode).timed()


def side_by_side(config: RunConfig, mode: str, copies: int = 2) -> float:
    """Milliseconds per update of each copy of the loop while `copies` of it run at once (their mean)."""
    context = multiprocessing.get_context("spawn")
    with context.Manager() as manager, context.Pool(copies) as pool:
        ready = manager.Barrier(copies)
        timed = pool.starmap(_timed_copy, [(config.to_dict(), mode, ready)] * copies)
    return sum(1000 * seconds / updates for seconds, updates in timed) / copies
