"""What a worker process keeps between tasks: run configs, global models by version, model modules, run objects."""

from __future__ import annotations

import contextlib
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, TypeVar, cast

from fedqueue.core.codec import BlobRef
from fedqueue.core.services import Services
from fedqueue.fl.config import RunConfig
from fedqueue.fl.worker.state_blobs import get_state

if TYPE_CHECKING:
    import torch
    from torch import nn

T = TypeVar("T")

# Global models a worker keeps: always the last MODELS_KEPT, and older ones while all fit in
# MODEL_BYTES_KEPT. A buffered-async version folds updates trained on several older versions, which
# a small model's worker then never reads back from Redis; a large model's keeps just the last few.
MODELS_KEPT = 4
MODEL_BYTES_KEPT = 64 * 2**20


def _state_bytes(state: dict[str, torch.Tensor]) -> int:
    return sum(tensor.numel() * tensor.element_size() for tensor in state.values())


class WorkerCache:
    """Per-process caches: run configs and global models by version, never fetched twice;
    the run's model modules, built once per slot."""

    def __init__(self, max_models: int = MODELS_KEPT, model_bytes: int = MODEL_BYTES_KEPT) -> None:
        self._lock = threading.Lock()
        self._configs: dict[str, RunConfig] = {}
        self._models: OrderedDict[str, tuple[dict[str, torch.Tensor], int]] = OrderedDict()  # state, its bytes
        self._model_bytes = 0
        self._max_model_bytes = model_bytes
        self._max_models = max_models
        self._idle_modules: OrderedDict[str, list[nn.Module]] = OrderedDict()  # by run, most recent last
        self._version_refs: OrderedDict[str, dict[int, BlobRef]] = OrderedDict()  # by run, most recent last
        self._run_objects: OrderedDict[tuple[str, str], Any] = OrderedDict()  # by (run, name), most recent last

    def run_config(self, services: Services, run_id: str) -> RunConfig:
        with self._lock:
            config = self._configs.get(run_id)
        if config is None:
            config = RunConfig.from_stored(services.store.get_run(run_id).config)
            with self._lock:
                self._configs[run_id] = config
        return config

    def global_state(self, services: Services, ref: BlobRef) -> dict[str, torch.Tensor]:
        # Keyed by sha256 as well, so a re-published version can never be served stale.
        cache_key = f"{ref.key}@{ref.sha256}"
        with self._lock:
            kept = self._models.get(cache_key)
            if kept is not None:
                self._models.move_to_end(cache_key)
                return kept[0]
        state = get_state(services.blobs, ref)
        self.keep_global_state(ref, state)
        return state

    def keep_global_state(self, ref: BlobRef, state: dict[str, torch.Tensor]) -> None:
        """A version this process made itself: served from memory, never read back."""
        size = _state_bytes(state)
        with self._lock:
            earlier = self._models.pop(f"{ref.key}@{ref.sha256}", None)
            self._model_bytes += size - (earlier[1] if earlier is not None else 0)
            self._models[f"{ref.key}@{ref.sha256}"] = (state, size)
            while len(self._models) > self._max_models and self._model_bytes > self._max_model_bytes:
                self._model_bytes -= self._models.popitem(last=False)[1][1]

    def version_refs(self, run_id: str) -> dict[int, BlobRef]:
        """Where a buffered run's published versions are, by number: a version's bytes never change,
        so fold passes on this process look each one up once."""
        with self._lock:
            refs = self._version_refs.setdefault(run_id, {})
            self._version_refs.move_to_end(run_id)
            while len(self._version_refs) > self._max_models:
                self._version_refs.popitem(last=False)
            return refs

    def run_object(self, run_id: str, name: str, build: Callable[[], T]) -> T:
        """A run's object that is costly to build (a fold pass's helpers): built once per process."""
        key = (run_id, name)
        with self._lock:
            found = self._run_objects.get(key)
            if found is not None:
                self._run_objects.move_to_end(key)
                return cast(T, found)
        built = build()
        with self._lock:
            self._run_objects[key] = built
            while len(self._run_objects) > self._max_models:
                self._run_objects.popitem(last=False)
        return built

    @contextlib.contextmanager
    def module(self, run_id: str, build: Callable[[], nn.Module]) -> Iterator[nn.Module]:
        """A module of the run's model that no other slot holds: reused, or built when none is idle.

        Building initializes every weight at random (a few ms for the CIFAR CNN), only to have them
        overwritten: each device loads the global weights, which resets the module completely. One
        that saw an error is not reused.
        """
        with self._lock:
            idle = self._idle_modules.get(run_id)
            module = idle.pop() if idle else None
        if module is None:
            module = build()
        yield module
        with self._lock:
            self._idle_modules.setdefault(run_id, []).append(module)
            self._idle_modules.move_to_end(run_id)
            while len(self._idle_modules) > self._max_models:
                self._idle_modules.popitem(last=False)
