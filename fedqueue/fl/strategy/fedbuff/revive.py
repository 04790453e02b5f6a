"""FedRevive in the fold pass: each folded update of a version mixed with a distilled one (fedqueue.fl.ml.distill).

The math is in fl/ml/distill.py; this module gathers what it needs on the worker that makes the
version: the distillation's inputs (the server's held-out data, or the data-free synthesizer's
pool), the teachers' local models (their update blobs, kept while they are recent), and a seeded
stream per update so every pass distils the same batches.

The data-free synthesizer learns across the whole run. Its state after each version is kept with
that version in the store (`server_state`), so the pass that makes the next version continues
from it on whichever worker it runs; a process that made the last version keeps it in memory.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING

import numpy as np
import torch

from fedqueue.errors import BlobIntegrityError
from fedqueue.fl.config import RunConfig
from fedqueue.fl.ml.data import load_federated
from fedqueue.fl.ml.distill import KD_STREAM, KdData, class_proportions, distil, kd_beta, mixed_delta
from fedqueue.fl.ml.models import build_model
from fedqueue.fl.ml.synthesis import SynthesisSettings, Synthesizer
from fedqueue.fl.ml.weights import decode_state, encode_state
from fedqueue.fl.setup import data_spec
from fedqueue.fl.strategy.fedbuff.schedule import Arrival, NewVersion, Trip

if TYPE_CHECKING:
    from torch import nn

    from fedqueue.fl.ml.aggregate import WeightedDelta

log = logging.getLogger(__name__)

LocalOf = Callable[[Trip], Mapping[str, torch.Tensor]]
VersionOf = Callable[[int], Mapping[str, torch.Tensor]]
ServerStateOf = Callable[[int], bytes | None]
SYNTH_STREAM = 0xFD4F  # the synthesizer's initial weights


class Reviver:
    """Distils and mixes the updates of a FedRevive run's versions (one per fold pass)."""

    def __init__(self, config: RunConfig) -> None:
        self.config = config
        self.data = load_federated(data_spec(config))
        labels = self.data.train.y.numpy()
        self._proportions = [class_proportions(labels[part], self.data.num_classes) for part in self.data.partitions]
        self._modules: dict[tuple[int, int], nn.Module] = {}
        self.kd_data: KdData | None = None
        # The data-free synthesizer and the version it stands after; None until a pass needs it.
        self._synthesizer: tuple[int, Synthesizer] | None = None
        if config.data_free:
            settings = config.dfkd
            self.freeze_rounds = int(settings.get("freeze_rounds", 50))
            return
        if self.data.server is None:
            raise RuntimeError("mode = 'fedrevive' needs the server's held-out data (kd_split)")
        index = torch.from_numpy(self.data.server.copy())
        self.kd_data = KdData(
            self.data.train.x.index_select(0, index), self.data.train.y.index_select(0, index), self.data.num_classes
        )

    def _module(self, state: Mapping[str, torch.Tensor]) -> nn.Module:
        model = build_model(self.config.model, self.data.input_shape, self.data.num_classes, self.config.plugin)
        model.load_state_dict(state)
        return model

    def _teacher(self, trip: Trip, local_of: LocalOf) -> nn.Module | None:
        """A teacher's model; None when its update went with a Redis that lost its data."""
        key = (trip.round_index, trip.device)
        if key not in self._modules:
            try:
                self._modules[key] = self._module(local_of(trip)).requires_grad_(False)
            except BlobIntegrityError:
                log.warning("teacher %d/%d lost with the broker: distilling without it", *key)
                return None
        return self._modules[key]

    def _teachers(self, arrival: Arrival, local_of: LocalOf) -> list[tuple[Trip, nn.Module]]:
        recent = list(reversed(arrival.recent))  # newest first, this update's own model leading
        found = [(trip, self._teacher(trip, local_of)) for trip in recent]
        return [(trip, model) for trip, model in found if model is not None]

    def _synthesizer_after(self, version: int, server_state_of: ServerStateOf) -> Synthesizer:
        """The data-free synthesizer as it stood once `version` was made: in memory, kept in the store, or new."""
        if self._synthesizer is not None and self._synthesizer[0] == version:
            return self._synthesizer[1]
        self._synthesizer = None  # it is advanced in place: never reused if a pass stops half-way
        knobs = {name: value for name, value in self.config.dfkd.items() if name != "freeze_rounds"}
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(int(np.random.default_rng([self.config.seed, SYNTH_STREAM]).integers(2**31)))
            synthesizer = Synthesizer(SynthesisSettings(**knobs), self.data.input_shape, self.data.num_classes)
        if version > 0:
            kept = server_state_of(version)
            if kept is None:
                raise RuntimeError(f"the synthesizer's state after version {version} is not in the store")
            synthesizer.load_state_dict(decode_state(kept))
        return synthesizer

    def server_state(self, version: int) -> bytes | None:
        """What the next version's pass continues from (the synthesizer after `version`); None for simple_kd."""
        if self._synthesizer is None or self._synthesizer[0] != version:
            return None
        return encode_state(self._synthesizer[1].state_dict())

    def deltas(
        self,
        event: NewVersion,
        version_of: VersionOf,
        local_of: LocalOf,
        server_state_of: ServerStateOf,
    ) -> Iterator[WeightedDelta]:
        """Each folded update's mixed change, in arrival order, with its staleness weight."""
        config = self.config
        made = event.version - 1  # versions made before this one: FedRevive's rounds_completed
        current = version_of(made)
        synthesizer = self._synthesizer_after(made, server_state_of) if config.data_free else None
        needed = {(trip.round_index, trip.device) for arrival in event.folded for trip in arrival.recent}
        self._modules = {key: module for key, module in self._modules.items() if key in needed}
        for arrival in event.folded:
            trip = arrival.trip
            beta = kd_beta(
                config.kd_beta,
                config.kd_beta_factor,
                arrival.staleness,
                config.resolved_concurrency,
                config.buffer_size,
            )
            if synthesizer is not None and made < self.freeze_rounds:
                beta = 0.0  # FedRevive leaves updates as they came until freeze_rounds versions are made
            kd_delta = None
            if beta > 0:
                teachers = self._teachers(arrival, local_of)
                proportions = [self._proportions[teacher.device] for teacher, _ in teachers]
                models = [model for _, model in teachers]
                student = self._module(current)
                rng = np.random.default_rng([config.seed, KD_STREAM, trip.round_index, trip.device])
                with torch.random.fork_rng(devices=[]):
                    torch.manual_seed(int(rng.integers(2**31)))
                    data, augment = self.kd_data, None
                    if synthesizer is not None:
                        synthesizer.synthesize(models, proportions, student, made)
                        inputs, labels = synthesizer.pool()
                        data, augment = KdData(inputs, labels, self.data.num_classes), synthesizer.augment
                    # Data-free: only past warmup does the student learn (until then kd_delta is 0).
                    if synthesizer is None or made > synthesizer.settings.warmup_rounds:
                        assert data is not None
                        distil(
                            student,
                            models,
                            proportions,
                            data,
                            rng,
                            iters=config.kd_iters,
                            lr=config.kd_lr,
                            batch_size=config.kd_batch_size,
                            temperature=config.kd_temperature,
                            version=config.kd_version,
                            augment=augment,
                        )
                distilled = student.state_dict()
                kd_delta = {
                    name: distilled[name].detach().to(torch.float64) - value.detach().to(torch.float64)
                    for name, value in current.items()
                    if value.is_floating_point()
                }
            yield arrival.weight, mixed_delta(version_of(trip.base_version), local_of(trip), kd_delta, beta)
        if synthesizer is not None:
            self._synthesizer = (event.version, synthesizer)
