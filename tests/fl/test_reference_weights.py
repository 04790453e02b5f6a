"""A queued FedAvg run ends on the weights of the same experiment written out here in plain torch.

The reference shares only the protocol with fedqueue: the data and its partition, which devices
each round selects, each task's seed, and the model's constructor and initial weights. Local
training (shuffling, batching, loss, SGD with momentum) and the sample-weighted averaging with
its global learning rate are written out below, so a change to either in fedqueue's training or
aggregation code fails this test, and so does one to the workers' plumbing.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from fedqueue.config import Settings
from fedqueue.fl import api
from fedqueue.fl.config import RunConfig
from fedqueue.fl.ml.data import device_data, load_federated
from fedqueue.fl.ml.models import build_model, initial_state
from fedqueue.fl.ml.plugins import TensorData
from fedqueue.fl.ml.seeding import task_seed
from fedqueue.fl.setup import data_spec
from fedqueue.fl.strategy.sync.rounds import select_devices
from tests.conftest import running_workers

State = dict[str, torch.Tensor]

# Dirichlet sizes differ per device (35 to 108 samples among those selected), so the weighting
# matters; 5 steps of 16 cross an epoch's short last batch and a reshuffle on the smaller devices;
# global_lr 0.7 (not 1, not a power of two) makes the server step a real rounding.
CONFIG: dict[str, Any] = {
    "dataset": "digits",
    "model": "mlp",
    "num_devices": 20,
    "devices_per_round": 4,
    "rounds": 2,
    "partition": "dirichlet",
    "alpha": 0.5,
    "local_iters": 5,
    "local_batch_size": 16,
    "local_lr": 0.1,
    "local_momentum": 0.5,
    "global_lr": 0.7,
    "seed": 7,
}


def _batches(count: int, batch_size: int, generator: torch.Generator) -> Iterator[torch.Tensor]:
    # Epochs back to back, each a fresh permutation; the last batch of an epoch may be short.
    while True:
        yield from torch.randperm(count, generator=generator).split(batch_size)


def _train(config: RunConfig, global_state: State, data: TensorData, seed: int) -> State:
    """local_iters steps of SGD with momentum on plain cross-entropy, from the global weights."""
    training = config.training
    assert training.local_iters is not None and training.local_optimizer == "sgd"
    info = load_federated(data_spec(config))
    model = build_model(config.model, info.input_shape, info.num_classes)
    model.load_state_dict(global_state)
    model.train()
    params = list(model.parameters())
    buffers: list[torch.Tensor | None] = [None] * len(params)
    count = len(data)
    batches = _batches(count, min(training.local_batch_size, count), torch.Generator().manual_seed(seed))
    for _ in range(training.local_iters):
        index = next(batches)
        for param in params:
            param.grad = None
        F.cross_entropy(model(data.x[index]), data.y[index]).backward()
        with torch.no_grad():
            for i, param in enumerate(params):
                assert param.grad is not None
                buffer = buffers[i]
                if buffer is None:  # the first step's buffer is the gradient itself (no dampening)
                    buffers[i] = buffer = param.grad.clone()
                else:
                    buffer.mul_(training.local_momentum).add_(param.grad)
                # alpha= is one fused multiply-add on the CPU; `param -= lr * buffer` rounds twice.
                param.add_(buffer, alpha=-training.local_lr)
    return {name: value.detach().clone() for name, value in model.state_dict().items()}


def _average(global_state: State, updates: dict[int, tuple[int, State]], global_lr: float) -> State:
    """global + global_lr * sample-weighted mean of (local - global): sum samples x (local - global) in float64 by
    device id, then scale by global_lr / total samples."""
    total = sum(samples for samples, _ in updates.values())
    averaged: State = {}
    for name, current in global_state.items():
        assert current.is_floating_point()  # the mlp has no integer buffers to carry over
        base = current.to(torch.float64)
        delta = torch.zeros_like(base)
        for device in sorted(updates):  # float sums depend on order; fedavg's is by device id
            samples, local = updates[device]
            delta.add_(local[name].to(torch.float64) - base, alpha=samples)  # the count as add_'s alpha
        averaged[name] = (base + (global_lr / total) * delta).to(current.dtype)
    return averaged


def reference_run(config: RunConfig) -> tuple[State, State]:
    """(initial, final) global weights of `config`, computed in this process."""
    spec = data_spec(config)
    info = load_federated(spec)
    start = initial_state(config.model, info.input_shape, info.num_classes, config.seed)
    state = start
    for round_index in range(1, config.rounds + 1):
        updates = {}
        for device in select_devices(config.seed, round_index, config.num_devices, config.devices_per_round):
            data = device_data(spec, device)
            seed = task_seed(config.seed, round_index, device)
            updates[device] = (len(data), _train(config, state, data, seed))
        state = _average(state, updates, config.global_lr)
    return start, state


def test_queued_fedavg_matches_plain_torch_reference(settings: Settings, tmp_path: Path) -> None:
    config = RunConfig.from_dict(CONFIG)
    # The workers train on the CPU (running_workers hides every GPU) with threads_per_task = 1;
    # one thread here too, so every matmul reduces in the same order and the weights match bit for bit.
    threads = torch.get_num_threads()
    torch.set_num_threads(settings.threads_per_task)
    try:
        initial, expected = reference_run(config)
    finally:
        torch.set_num_threads(threads)

    # The reference moved away from the start: comparing an untouched model could not pass.
    assert any(not torch.equal(initial[name], expected[name]) for name in initial)

    with running_workers(settings, procs=2, log_dir=tmp_path / "logs"):
        handle = api.submit(config, settings=settings)
        status = handle.wait(timeout_s=120)
    assert status["state"] == "finished"
    actual = handle.final_weights()
    assert actual.keys() == expected.keys()
    for name in expected:
        assert actual[name].dtype == expected[name].dtype, name
        assert torch.equal(actual[name], expected[name]), f"{name} differs from the plain-torch reference"
