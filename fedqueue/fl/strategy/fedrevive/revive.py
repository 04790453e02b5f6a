"""FedRevive in the fold pass: each folded update of a version mixed with a distilled one (fedqueue.fl.ml.distill).

The math is in fl/ml/distill.py; this module gathers what it needs on the worker that makes the
version: the distillation's inputs (the server's held-out data, or the data-free synthesizer's
pool), the teachers' local models (their update blobs, kept while they are recent), and a seeded
stream per update so every pass distils the same batches.

The data-free synthesizer learns across the whole run. Its state after each version (and, with
`class_proportion_source = "estimated"`, the devices' estimated class proportions) is kept with
that version in the store (`server_state`), so the pass that makes the next version continues
from it on whichever worker it runs; a process that made the last version keeps it in memory.
The teachers, the student and the generator sit on the worker's GPU when it has one.
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
from fedqueue.fl.ml.distill import KD_STREAM, KdData, class_proportions, dfkd_defaults, distil, kd_beta, mixed_delta
from fedqueue.fl.ml.models import build_model
from fedqueue.fl.ml.proportion_proxy import ProportionProxy
from fedqueue.fl.ml.synthesis import SynthesisSettings, Synthesizer, image_shape
from fedqueue.fl.ml.teacher_stack import TeacherStack
from fedqueue.fl.ml.torch_device import torch_device
from fedqueue.fl.ml.weights import decode_state, encode_state
from fedqueue.fl.setup import data_spec
from fedqueue.fl.strategy.fedbuff.schedule import Arrival, NewVersion, Trip
from fedqueue.fl.strategy.fedrevive.section import FedReviveSection

if TYPE_CHECKING:
    from torch import nn

    from fedqueue.fl.ml.aggregate import WeightedDelta

log = logging.getLogger(__name__)

LocalOf = Callable[[Trip], Mapping[str, torch.Tensor]]
VersionOf = Callable[[int], Mapping[str, torch.Tensor]]
ServerStateOf = Callable[[int], bytes | None]
SYNTH_STREAM = 0xFD4F  # the synthesizer's initial weights
PROXY_PREFIX = "proxy."  # the estimated class proportions' keys in the kept server state


class ServerState:
    """What a data-free run's server carries from one version to the next."""

    def __init__(self, synthesizer: Synthesizer, proxy: ProportionProxy | None) -> None:
        self.synthesizer, self.proxy = synthesizer, proxy

    def state_dict(self) -> dict[str, torch.Tensor]:
        state = self.synthesizer.state_dict()
        if self.proxy is not None:
            state.update({PROXY_PREFIX + name: value for name, value in self.proxy.state_dict().items()})
        return state

    def load_state_dict(self, state: Mapping[str, torch.Tensor]) -> None:
        self.synthesizer.load_state_dict({k: v for k, v in state.items() if not k.startswith(PROXY_PREFIX)})
        if self.proxy is not None:
            self.proxy.load_state_dict(
                {k[len(PROXY_PREFIX) :]: v for k, v in state.items() if k.startswith(PROXY_PREFIX)}
            )


class Reviver:
    """Distils and mixes the updates of a FedRevive run's versions (one per fold pass)."""

    def __init__(self, config: RunConfig, device: torch.device | None = None) -> None:
        self.config = config
        self.settings = config.strategy(FedReviveSection)
        self.device = torch_device() if device is None else device
        self.data = load_federated(data_spec(config))
        labels = self.data.train.y.numpy()
        self._proportions = [class_proportions(labels[part], self.data.num_classes) for part in self.data.partitions]
        self._modules: dict[tuple[int, int], nn.Module] = {}
        self.kd_data: KdData | None = None
        # The data-free server's state and the version it stands after; None until a pass needs it.
        self._server: tuple[int, ServerState] | None = None
        if config.data_free:
            self.knobs = {**dfkd_defaults(), **self.settings.dfkd}
            self.freeze_rounds = int(self.knobs["freeze_rounds"])
            return
        if self.data.server is None:
            raise RuntimeError("mode = 'fedrevive' needs the server's held-out data (kd_split)")
        index = torch.from_numpy(self.data.server.copy())
        self.kd_data = KdData(
            self.data.train.x.index_select(0, index), self.data.train.y.index_select(0, index), self.data.num_classes
        )

    def _pixel_range(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Each channel's lowest and highest value in the training data: the generator's output range."""
        images = self.data.train.x.reshape(len(self.data.train.x), *image_shape(self.data.input_shape))
        per_channel = images.transpose(0, 1).reshape(images.shape[1], -1)
        return per_channel.min(dim=1).values, per_channel.max(dim=1).values

    def _module(self, state: Mapping[str, torch.Tensor]) -> nn.Module:
        model = build_model(self.config.model, self.data.input_shape, self.data.num_classes, self.config.plugin)
        model.load_state_dict(state)
        return model.to(self.device)

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

    def _server_after(self, version: int, server_state_of: ServerStateOf) -> ServerState:
        """The data-free server's state as it stood once `version` was made: in memory, kept in the store, or new."""
        if self._server is not None and self._server[0] == version:
            return self._server[1]
        self._server = None  # it is advanced in place: never reused if a pass stops half-way
        knobs = self.knobs
        settings = SynthesisSettings(**{name: knobs[name] for name in SynthesisSettings.__dataclass_fields__})
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(int(np.random.default_rng([self.config.seed, SYNTH_STREAM]).integers(2**31)))
            synthesizer = Synthesizer(
                settings,
                self.data.input_shape,
                self.data.num_classes,
                pixel_range=self._pixel_range(),
                rotate=self.config.data.augment == "crop_flip_rotate",
            )
        proxy = None
        if knobs["class_proportion_source"] == "estimated":
            proxy = ProportionProxy(
                self.data.input_shape,
                self.data.num_classes,
                self.config.seed,
                uploads=int(knobs["proxy_uploads"]),
                temperature=float(knobs["proxy_temperature"]),
                probes=int(knobs["proxy_probes"]),
            )
        server = ServerState(synthesizer, proxy)
        if version > 0:
            kept = server_state_of(version)
            if kept is None:
                raise RuntimeError(f"the synthesizer's state after version {version} is not in the store")
            server.load_state_dict(decode_state(kept))
        return server

    def server_state(self, version: int) -> bytes | None:
        """What the next version's pass continues from (the server's state after `version`); None for simple_kd."""
        if self._server is None or self._server[0] != version:
            return None
        return encode_state(self._server[1].state_dict())

    def _shares(self, device: int, server: ServerState | None) -> np.ndarray:
        """A device's class proportions as the server knows them: its labels', or their estimate."""
        if server is not None and server.proxy is not None:
            return server.proxy.of(device)
        return self._proportions[device]

    def deltas(
        self,
        event: NewVersion,
        version_of: VersionOf,
        local_of: LocalOf,
        server_state_of: ServerStateOf,
    ) -> Iterator[WeightedDelta]:
        """Each folded update's mixed change, in arrival order, with its staleness weight."""
        config, settings = self.config, self.settings
        made = event.version - 1  # versions made before this one: FedRevive's rounds_completed
        current = version_of(made)
        server = self._server_after(made, server_state_of) if config.data_free else None
        needed = {(trip.round_index, trip.device) for arrival in event.folded for trip in arrival.recent}
        self._modules = {key: module for key, module in self._modules.items() if key in needed}
        for arrival in event.folded:
            trip = arrival.trip
            if server is not None and server.proxy is not None and server.proxy.wants(trip.device):
                uploaded = self._teacher(trip, local_of)
                if uploaded is not None:
                    server.proxy.observe(trip.device, uploaded)
            beta = kd_beta(
                settings.kd_beta,
                settings.kd_beta_factor,
                arrival.staleness,
                settings.resolved_concurrency(config),
                settings.buffer_size,
            )
            if server is not None and made < self.freeze_rounds:
                beta = 0.0  # FedRevive leaves updates as they came until freeze_rounds versions are made
            kd_delta = self._kd_delta(arrival, current, made, server, local_of) if beta > 0 else None
            yield arrival.weight, mixed_delta(version_of(trip.base_version), local_of(trip), kd_delta, beta)
        if server is not None:
            self._server = (event.version, server)

    def _kd_delta(
        self,
        arrival: Arrival,
        current: Mapping[str, torch.Tensor],
        made: int,
        server: ServerState | None,
        local_of: LocalOf,
    ) -> dict[str, torch.Tensor]:
        """The distilled student's change from the current version, for one revived update."""
        config, settings, trip = self.config, self.settings, arrival.trip
        teachers = self._teachers(arrival, local_of)
        proportions = [self._shares(teacher.device, server) for teacher, _ in teachers]
        stack = TeacherStack([model for _, model in teachers])
        student = self._module(current)
        rng = np.random.default_rng([config.seed, KD_STREAM, trip.round_index, trip.device])
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(int(rng.integers(2**31)))
            data, augment, guard, decay, learns = self.kd_data, None, None, 0.0, True
            if server is not None:
                synthesizer = server.synthesizer
                if made % int(self.knobs["synthesis_interval"]) == 0:
                    student.requires_grad_(False)  # the adversarial term needs no gradient of the student's own
                    synthesizer.synthesize(stack, torch.as_tensor(np.stack(proportions)), student, made)
                    student.requires_grad_(True)
                inputs, labels = synthesizer.pool()
                data = KdData(inputs, labels, self.data.num_classes) if len(labels) else None
                augment, guard = synthesizer.augment, synthesizer.windows["kd"]
                decay = float(self.knobs["student_weight_decay"])
                # Data-free: only past warmup does the student learn (until then kd_delta is 0).
                learns = made > synthesizer.settings.warmup_rounds
            if learns and data is not None:
                distil(
                    student,
                    stack,
                    proportions,
                    data,
                    rng,
                    iters=settings.kd_iters,
                    lr=settings.kd_lr,
                    batch_size=settings.kd_batch_size,
                    temperature=settings.kd_temperature,
                    version=settings.kd_version,
                    augment=augment,
                    weight_decay=decay,
                    guard=guard,
                )
        distilled = student.state_dict()
        return {
            name: distilled[name].detach().cpu().to(torch.float64) - value.detach().to(torch.float64)
            for name, value in current.items()
            if value.is_floating_point()
        }
