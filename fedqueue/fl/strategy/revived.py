"""FedRevive in the fold pass: each folded update of a version mixed with a distilled one (fedqueue.fl.revive).

The math is in fl/revive.py; this module gathers what it needs on the worker that makes the
version: the server's held-out data, the teachers' local models (their update blobs, kept while
they are recent), and a seeded stream per update so every pass distils the same batches.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING

import numpy as np
import torch

from fedqueue.errors import BlobIntegrityError
from fedqueue.fl.config import RunConfig
from fedqueue.fl.strategy.schedule import NewVersion, Trip

if TYPE_CHECKING:
    from torch import nn

    from fedqueue.fl.aggregate import WeightedDelta

log = logging.getLogger(__name__)

LocalOf = Callable[[Trip], Mapping[str, torch.Tensor]]
VersionOf = Callable[[int], Mapping[str, torch.Tensor]]


class Reviver:
    """Distils and mixes the updates of a FedRevive run's versions (one per fold pass)."""

    def __init__(self, config: RunConfig) -> None:
        from fedqueue.fl.data import load_federated
        from fedqueue.fl.experiment import data_spec
        from fedqueue.fl.revive import KdData, class_proportions

        self.config = config
        self.data = load_federated(data_spec(config))
        if self.data.server is None:
            raise RuntimeError("mode = 'fedrevive' needs the server's held-out data (kd_split)")
        index = torch.from_numpy(self.data.server.copy())
        self.kd_data = KdData(
            self.data.train.x.index_select(0, index), self.data.train.y.index_select(0, index), self.data.num_classes
        )
        labels = self.data.train.y.numpy()
        self._proportions = [class_proportions(labels[part], self.data.num_classes) for part in self.data.partitions]
        self._modules: dict[tuple[int, int], nn.Module] = {}

    def _module(self, state: Mapping[str, torch.Tensor]) -> nn.Module:
        from fedqueue.fl.models import build_model

        model = build_model(self.config.model, self.data.input_shape, self.data.num_classes, self.config.plugin)
        model.load_state_dict(state)
        return model

    def _teacher(self, trip: Trip, local_of: LocalOf) -> nn.Module | None:
        """A teacher's model; None when its update went with a Redis that lost its data."""
        key = (trip.round_index, trip.device)
        if key not in self._modules:
            try:
                self._modules[key] = self._module(local_of(trip))
            except BlobIntegrityError:
                log.warning("teacher %d/%d lost with the broker: distilling without it", *key)
                return None
        return self._modules[key]

    def deltas(self, event: NewVersion, version_of: VersionOf, local_of: LocalOf) -> Iterator[WeightedDelta]:
        """Each folded update's mixed change, in arrival order, with its staleness weight."""
        from fedqueue.fl.revive import distil, kd_beta, mixed_delta

        config = self.config
        current = version_of(event.version - 1)
        for arrival in event.folded:
            trip = arrival.trip
            beta = kd_beta(
                config.kd_beta,
                config.kd_beta_factor,
                arrival.staleness,
                config.resolved_concurrency,
                config.buffer_size,
            )
            kd_delta = None
            if beta > 0:
                recent = list(reversed(arrival.recent))  # newest first, this update's own model leading
                found = [(trip, self._teacher(trip, local_of)) for trip in recent]
                teachers = [(trip, model) for trip, model in found if model is not None]
                student = self._module(current)
                rng = np.random.default_rng([config.seed, 0xFD4E, trip.round_index, trip.device])
                with torch.random.fork_rng(devices=[]):
                    torch.manual_seed(int(rng.integers(2**31)))
                    distil(
                        student,
                        [model for _, model in teachers],
                        [self._proportions[teacher.device] for teacher, _ in teachers],
                        self.kd_data,
                        rng,
                        iters=config.kd_iters,
                        lr=config.kd_lr,
                        batch_size=config.kd_batch_size,
                        temperature=config.kd_temperature,
                        version=config.kd_version,
                    )
                distilled = student.state_dict()
                kd_delta = {
                    name: distilled[name].detach().to(torch.float64) - value.detach().to(torch.float64)
                    for name, value in current.items()
                    if value.is_floating_point()
                }
            yield arrival.weight, mixed_delta(version_of(trip.base_version), local_of(trip), kd_delta, beta)
