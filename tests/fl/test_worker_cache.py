"""A worker keeps one model module per slot and run, and trains every device with it.

Building a module initializes all its weights at random, only for the device to overwrite them;
reusing one must change nothing: the run ends on the reference weights bit for bit.
In this process, on real Redis and a real store.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from fedqueue.config import Settings
from fedqueue.core.connect import open_services
from fedqueue.fl.messages import DeviceTask
from fedqueue.fl.ml import models
from fedqueue.fl.scheduler import submit_run
from fedqueue.fl.strategy.common import final_state
from fedqueue.fl.strategy.sync.rounds import aggregate_round
from fedqueue.fl.strategy.sync.strategy import SYNCHRONOUS
from fedqueue.fl.worker.cache import WorkerCache
from fedqueue.fl.worker.device_task import run_device_task
from tests.support.helpers import assert_same_weights, reference_final_state, small_config


def test_one_module_trains_every_device_of_a_run_and_the_weights_do_not_change(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    built: list[nn.Module] = []
    build_model = models.build_model

    def counted(*args: Any, **kwargs: Any) -> nn.Module:
        built.append(build_model(*args, **kwargs))
        return built[-1]

    monkeypatch.setattr(models, "build_model", counted)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as a worker's task trains (threads_per_task), and as the reference does
    config = small_config(devices_per_round=4, rounds=1, local_iters=3)
    sent: list[Any] = []
    services = open_services(settings, sent.extend, migrate=True)
    try:
        run_id = submit_run(services, config)
        built.clear()  # the initial weights' model
        cache = WorkerCache()
        tasks = [message for message in sent if isinstance(message, DeviceTask)]
        assert len(tasks) == 4
        for task in tasks:
            assert run_device_task(services, cache, task, "test@host", 1, SYNCHRONOUS) == 1
        assert len(built) == 1
        assert aggregate_round(services, run_id, 1, "test@host#1") is not None
        assert_same_weights(final_state(services.store, run_id), reference_final_state(config))
    finally:
        services.close()
        torch.set_num_threads(threads)


def test_a_module_is_lent_to_one_holder_at_a_time_and_dropped_after_an_error() -> None:
    cache = WorkerCache()
    built: list[nn.Module] = []

    def build() -> nn.Module:
        built.append(nn.Linear(2, 2))
        return built[-1]

    with cache.module("run-a", build) as first, cache.module("run-a", build) as second:
        assert first is not second  # two slots training at once never share one
    with cache.module("run-a", build) as again:
        assert again in (first, second)
    with cache.module("run-b", build) as other_run:
        assert other_run is built[2]  # a run's module never serves another run
    with pytest.raises(RuntimeError), cache.module("run-b", build):
        raise RuntimeError("training failed")
    with cache.module("run-b", build) as after_error:
        assert after_error is built[3]  # the failed one was not kept
    assert len(built) == 4


class _CountedBlobs:
    """Stands in for the blob store: counts the reads a cache miss makes (pure cache logic)."""

    def __init__(self) -> None:
        self.reads = 0
        self.blobs = self

    def get(self, ref: Any) -> bytes:
        from fedqueue.fl.ml.weights import encode_state

        self.reads += 1
        return encode_state({"w": torch.zeros(1)})


def _ref(version: int) -> Any:
    from fedqueue.core.codec import BlobRef

    return BlobRef(key=f"global:{version}", sha256=f"{version:064d}", nbytes=1)


def test_small_models_are_kept_by_size_and_large_ones_by_count() -> None:
    """A buffered-async version folds updates from several older versions: a worker keeps all it can
    of a small model's (never reading them back), and always the last few of a large one's."""
    small = WorkerCache(max_models=2, model_bytes=10_000)
    for version in range(8):  # 8 x 400 bytes fit the budget
        small.keep_global_state(_ref(version), {"w": torch.zeros(100)})
    large = WorkerCache(max_models=2, model_bytes=10_000)
    for version in range(8):  # 8 x 40 kB do not: the last 2 stay
        large.keep_global_state(_ref(version), {"w": torch.zeros(10_000)})
    blobs = _CountedBlobs()
    for version in range(8):
        small.global_state(blobs, _ref(version))  # type: ignore[arg-type]
    assert blobs.reads == 0
    for version in (6, 7):
        large.global_state(blobs, _ref(version))  # type: ignore[arg-type]
    assert blobs.reads == 0
    large.global_state(blobs, _ref(0))  # type: ignore[arg-type]
    assert blobs.reads == 1
