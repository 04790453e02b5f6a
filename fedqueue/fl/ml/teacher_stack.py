"""Several models of one architecture asked as one: their weights stacked, each call vmapped over them.

FedRevive's server asks up to 8 teachers (recent local models) at every step of its synthesis and
distillation. One vmapped call (torch.func.stack_module_state + functional_call) replaces a loop of
small ones. A model whose layers cannot be vmapped is asked one teacher after another instead.

Each teacher can also report how far a batch's feature statistics sit from its own running ones
(its BatchNorm layers' or StatTrackers', fl/ml/stat_resnet.py): the synthesis matches them.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor, nn
from torch.func import functional_call, stack_module_state, vmap

from fedqueue.fl.ml.stat_resnet import StatTracker

log = logging.getLogger(__name__)


def tracks_statistics(layer: nn.Module) -> bool:
    """BatchNorm with running statistics, or a StatTracker: both see a convolution's output and keep its mean
    and variance, so one hook reads either."""
    if isinstance(layer, StatTracker):
        return True
    return isinstance(layer, nn.BatchNorm1d | nn.BatchNorm2d) and layer.running_mean is not None


class _StatDistance:
    """Forward hooks on a model that add up, per call, the L2 distances of a batch's per-channel mean and
    (biased) variance from each hooked layer's running ones."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.terms: list[Tensor] = []
        self.layers = [layer for layer in model.modules() if tracks_statistics(layer)]
        for layer in self.layers:
            layer.register_forward_hook(self._hook)

    def _hook(self, layer: nn.Module, inputs: tuple[Tensor, ...], _: Tensor) -> None:
        features = inputs[0]
        dims = [0] if features.dim() == 2 else [0, 2, 3]
        mean = features.mean(dim=dims)
        var = features.var(dim=dims, unbiased=False)
        running_mean, running_var = layer.running_mean, layer.running_var
        assert isinstance(running_mean, Tensor) and isinstance(running_var, Tensor)
        self.terms.append(torch.linalg.vector_norm(running_var - var) + torch.linalg.vector_norm(running_mean - mean))

    def take(self, like: Tensor) -> Tensor:
        total = torch.stack(self.terms).sum() if self.terms else like.new_zeros(())
        self.terms = []
        return total


class TeacherStack:
    """The teachers, in eval mode and frozen, asked together."""

    def __init__(self, teachers: Sequence[nn.Module]) -> None:
        if not teachers:
            raise ValueError("a teacher stack needs at least one teacher")
        self.teachers = [teacher.eval().requires_grad_(False) for teacher in teachers]
        self.count = len(self.teachers)
        # A shell of the architecture for functional_call; its hooks see each teacher's own buffers.
        self._shell = _StatDistance(copy.deepcopy(self.teachers[0]).to("meta").eval())
        self._weights: dict[str, Tensor] = {}
        if self.count > 1:
            params, buffers = stack_module_state(self.teachers)
            self._weights = {name: value.detach() for name, value in {**params, **buffers}.items()}
        self._hooked: list[_StatDistance] = []  # the loop's hooked copies, made when first needed

    @property
    def has_statistics(self) -> bool:
        return bool(self._shell.layers)

    def _one(self, weights: dict[str, Tensor], inputs: Tensor) -> tuple[Tensor, Tensor]:
        logits = functional_call(self._shell.model, weights, (inputs,))
        return logits, self._shell.take(logits)

    def _run(self, inputs: Tensor, same_inputs: bool) -> tuple[Tensor, Tensor]:
        if self._weights:
            try:
                in_dims: tuple[Any, ...] = (0, None if same_inputs else 0)
                call: Callable[..., tuple[Tensor, Tensor]] = vmap(self._one, in_dims=in_dims)
                return call(self._weights, inputs)
            except (RuntimeError, NotImplementedError) as err:
                self._shell.terms = []
                log.warning("teachers asked one by one: their model cannot be vmapped (%s)", err)
                self._weights = {}
        if not self._hooked:
            # Copies, so the caller's modules stay free of hooks.
            self._hooked = [_StatDistance(copy.deepcopy(teacher)) for teacher in self.teachers]
        outputs = []
        for index, hooked in enumerate(self._hooked):
            logits = hooked.model(inputs if same_inputs else inputs[index])
            outputs.append((logits, hooked.take(logits)))
        return torch.stack([logits for logits, _ in outputs]), torch.stack([stats for _, stats in outputs])

    def ask(self, inputs: Tensor) -> tuple[Tensor, Tensor]:
        """Every teacher on the same batch: logits (teachers, batch, classes) and each teacher's statistics
        distance (teachers,), zero for models that keep no statistics."""
        return self._run(inputs, same_inputs=True)

    def ask_each(self, inputs: Tensor) -> Tensor:
        """Teacher k on batch k of `inputs` (teachers, batch, ...): logits (teachers, batch, classes)."""
        return self._run(inputs, same_inputs=False)[0]
