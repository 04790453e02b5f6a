"""Local training of a pack of devices in one stacked computation (torch.func + vmap).

Each device's parameters are a slice of tensors stacked along a new leading dimension.
One step runs every active device's forward and backward pass as one batched call; an
ordinary torch optimizer over the stacked tensors then updates each slice exactly as it
would update that device alone (SGD and Adam work element by element). Devices keep
their own seeds, batch orders and step counts, so each ends where sequential training ends,
within float tolerance.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

import torch
from torch import Tensor, nn
from torch.func import functional_call, vmap

from fedqueue.fl.ml.aggregate import Scratch, sliced
from fedqueue.fl.ml.augment import augment_generator, augment_stacked
from fedqueue.fl.ml.plugins import LocalStep, Options, TensorData
from fedqueue.fl.ml.stat_resnet import StatTracker
from fedqueue.fl.ml.train import (
    LocalTrainConfig,
    OptimizerFactory,
    Stepper,
    TrainOutcome,
    batch_indices,
    check_train_config,
    cpu_copy,
    cross_entropy_step,
    local_schedule,
    make_optimizer,
)


class PackMember:
    """One device of a vmapped pack, as a local step sees it: callable like the model, with its parameters.

    A step written against `model(inputs)` and `model.parameters()` (or `named_parameters()`)
    runs unchanged; anything else it asks of the module is refused when the run is submitted.
    """

    def __init__(self, module: nn.Module, parameters: dict[str, Tensor], buffers: dict[str, Tensor]) -> None:
        self._module = module
        self._parameters = parameters
        self._buffers = buffers
        self.training = True

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return functional_call(self._module, (self._parameters, self._buffers), args, kwargs)

    def parameters(self) -> Iterator[Tensor]:
        return iter(self._parameters.values())

    def named_parameters(self) -> Iterator[tuple[str, Tensor]]:
        return iter(self._parameters.items())


def vmap_refusal(model: nn.Module) -> str | None:
    """Why `model` cannot train in a vmapped pack, or None: running statistics and dropout are per call."""
    for name, module in model.named_modules():
        if isinstance(module, nn.modules.batchnorm._BatchNorm) and module.track_running_stats:
            return f"the model has BatchNorm running statistics ({type(module).__name__} {name!r})"
        if isinstance(module, StatTracker):
            return f"the model has running statistics (StatTracker {name!r})"
        if isinstance(module, nn.modules.dropout._DropoutNd) and module.p > 0:
            return f"the model has dropout ({type(module).__name__} {name!r})"
    return None


@dataclass
class StackedPack:
    """A pack's trained weights, still stacked on the training device: one slice per device."""

    parameters: dict[str, Tensor]  # name -> (devices, *shape)
    global_state: dict[str, Tensor]  # the weights every device started from, on the training device
    samples: list[int]
    losses: list[float]
    steps: list[int]

    def outcomes(self) -> list[TrainOutcome]:
        """One outcome per device, its weights on the CPU (one copy per tensor for the whole pack)."""
        on_cpu = {name: cpu_copy(value) for name, value in self.parameters.items()}
        return [
            TrainOutcome(
                state={
                    key: on_cpu[key][member] if key in on_cpu else cpu_copy(value)
                    for key, value in self.global_state.items()
                },
                samples=samples,
                loss=loss,
                steps=steps,
            )
            for member, (samples, loss, steps) in enumerate(zip(self.samples, self.losses, self.steps, strict=True))
        ]

    def weighted_delta_sum(self) -> dict[str, Tensor]:
        """sum over devices of samples x (local - global), in float64, on the CPU: FedAvg's share of the pack.

        Floating buffers are not trained, so their share is zero; counters (integer tensors) are
        the pack's, as FedAvg takes them from a round's lowest device.
        """
        summed: dict[str, Tensor] = {}
        for key, start in self.global_state.items():
            stacked = self.parameters.get(key)
            if not start.is_floating_point():
                summed[key] = cpu_copy(start)
                continue
            if stacked is None:
                summed[key] = torch.zeros(start.shape, dtype=torch.float64)
                continue
            # A cache-sized slice at a time, every device's share added in device order: no float64 copy of
            # the stacked weights (the pack's size times the state), which cost more than the pack's training
            # for a big state.
            total = torch.zeros(start.shape, dtype=torch.float64, device=start.device)
            scratch = Scratch()
            for into, before, *members in sliced(total, start, *stacked.detach().unbind(0)):
                for trained, samples in zip(members, self.samples, strict=True):
                    into.add_(scratch.difference(trained, before).mul_(samples))
            summed[key] = total if total.device.type == "cpu" else total.to("cpu")
        return summed


def train_pack(
    model: nn.Module,
    datas: Sequence[TensorData],
    cfg: LocalTrainConfig,
    seeds: Sequence[int],
    device: torch.device,
    step: LocalStep = cross_entropy_step,
    options: Options | None = None,
    optimizer_of: OptimizerFactory = make_optimizer,
) -> StackedPack:
    """Train every device of a pack from `model`'s weights (the global model), in one stacked computation.

    The weights stay stacked on the training device: `outcomes()` gives one per device on the CPU.
    """
    check_train_config(cfg)
    refusal = vmap_refusal(model)
    if refusal is not None:
        raise ValueError(f"pack_mode: {refusal}")
    size = len(datas)
    schedules = [local_schedule(len(data), cfg) for data in datas]
    steps = [device_steps for _, device_steps in schedules]
    model.to(device).train()
    global_state = {key: cpu_copy(value).to(device) for key, value in model.state_dict().items()}
    buffers = {name: buffer.detach() for name, buffer in model.named_buffers()}
    stacked = {
        name: parameter.detach().unsqueeze(0).repeat(size, *([1] * parameter.dim())).requires_grad_()
        for name, parameter in model.named_parameters()
    }
    optimizer = optimizer_of(stacked.values(), cfg)
    options = dict(options or {})
    # Private generators, one per device, drawn exactly as sequential training draws them.
    orders = [
        batch_indices(len(data), batch_size, torch.Generator(device="cpu").manual_seed(seed))
        for data, (batch_size, _), seed in zip(datas, schedules, seeds, strict=True)
    ]
    # Drawn as sequential training draws them.
    augmenting = [augment_generator(seed) for seed in seeds] if cfg.augment is not None else []
    # Every device's samples in one tensor on the training device: a step gathers its batches
    # with one index copied there, not a copy per device (each a wait on a GPU).
    inputs = torch.cat([data.x for data in datas]).to(device)
    labels = torch.cat([data.y for data in datas]).to(device)
    offsets = torch.tensor([0] + [len(data) for data in datas]).cumsum(0)[:-1].tolist()

    def member_loss(parameters: dict[str, Tensor], batch_inputs: Tensor, batch_labels: Tensor) -> Tensor:
        member = cast(nn.Module, PackMember(model, parameters, buffers))  # duck-typed for the step
        return step(member, (batch_inputs, batch_labels), global_state, options)

    batched_loss = vmap(member_loss)
    loss_sums = torch.zeros(size, dtype=torch.float64, device=device)
    for step_index in range(max(steps)):
        active = [member for member in range(size) if step_index < steps[member]]
        drawn = {member: next(orders[member]) for member in active}
        optimizer.zero_grad(set_to_none=True)
        # A short batch (the end of an epoch) has its own length: devices are grouped by it.
        for members in _by_length(drawn):
            everyone = len(members) == size
            chosen = torch.tensor(members).to(device, non_blocking=True)
            parameters = (
                stacked if everyone else {name: value.index_select(0, chosen) for name, value in stacked.items()}
            )
            rows = torch.stack([drawn[member] + offsets[member] for member in members]).to(device, non_blocking=True)
            batch = inputs[rows]
            if cfg.augment is not None:
                batch = augment_stacked(cfg.augment, batch, [augmenting[member] for member in members])
            losses = batched_loss(parameters, batch, labels[rows])
            losses.sum().backward()
            loss_sums.index_add_(0, chosen, losses.detach().to(torch.float64))
        _step_active(optimizer, stacked.values(), active, size)

    return StackedPack(
        parameters={name: value.detach() for name, value in stacked.items()},
        global_state=global_state,
        samples=[len(data) for data in datas],
        losses=[total / count for total, count in zip(loss_sums.tolist(), steps, strict=True)],
        steps=steps,
    )


def _by_length(drawn: Mapping[int, Tensor]) -> list[list[int]]:
    groups: dict[int, list[int]] = {}
    for member, index in drawn.items():
        groups.setdefault(len(index), []).append(member)
    return list(groups.values())


def _step_active(optimizer: Stepper, stacked: Any, active: Sequence[int], size: int) -> None:
    """One optimizer step that leaves devices done with their local steps exactly as they were.

    Momentum and Adam would move a device whose gradient is zero, so its slices of the
    parameters and of the optimizer state are put back after the step.
    """
    if len(active) == size:
        optimizer.step()
        return
    resting = torch.tensor(sorted(set(range(size)) - set(active)))
    parameters = list(stacked)
    tensors = parameters + [
        value
        for parameter in parameters
        for value in optimizer.state.get(parameter, {}).values()
        if isinstance(value, Tensor) and value.dim() > 0 and value.shape[0] == size
    ]
    with torch.no_grad():
        saved = [(tensor, tensor.index_select(0, resting.to(tensor.device))) for tensor in tensors]
        optimizer.step()
        for tensor, kept in saved:
            tensor.index_copy_(0, resting.to(tensor.device), kept)
