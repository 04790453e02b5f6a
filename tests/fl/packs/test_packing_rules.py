"""How "auto" chooses packs: pure rules, and the choice as a submitted run records it."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any, BinaryIO

import pytest

from fedqueue.fl.config import RunConfig
from fedqueue.fl.ml.data import load_federated
from fedqueue.fl.ml.pack_train import StackedPack
from fedqueue.fl.ml.weights import encode_state
from fedqueue.fl.packs.rules import (
    AUTO_PACK_MAX,
    UNSUMMED_VMAP_MARGIN,
    VMAP_TOLERANCE,
    auto_pack_mode,
    auto_pack_size,
    has_gpu_workers,
    measured_pack_mode,
    total_slots,
)
from fedqueue.fl.packs.trial import resolve_packing, time_pack_modes
from fedqueue.fl.setup import data_spec


@pytest.mark.parametrize(
    ("devices", "slots", "size"),
    [(20, 2, 5), (100, 4, 13), (7, 8, 1), (1000, 2, AUTO_PACK_MAX), (100, 0, 50)],
)
def test_auto_size_keeps_every_slot_busy_twice_over(devices: int, slots: int, size: int) -> None:
    assert auto_pack_size(devices, slots) == size


def test_slots_and_gpus_are_read_from_the_workers() -> None:
    workers = {"cpu0@a": 2, "cpu1@a": 1, "gpu0-1@b": 3}
    assert total_slots(workers) == 6
    assert has_gpu_workers(workers) and not has_gpu_workers({"cpu0@a": 1})


def test_auto_mode_never_vmaps_convolutions_on_a_cpu() -> None:
    assert auto_pack_mode(has_convolution=True, on_gpu=False, vmap_refused=None)[0] == "sequential"
    assert auto_pack_mode(has_convolution=True, on_gpu=True, vmap_refused=None)[0] == "vmap"
    assert auto_pack_mode(has_convolution=False, on_gpu=False, vmap_refused=None)[0] == "vmap"
    mode, why = auto_pack_mode(has_convolution=False, on_gpu=True, vmap_refused="the model has dropout")
    assert mode == "sequential" and "dropout" in why


def _config(**changes: object) -> RunConfig:
    base = {"dataset": "synthetic", "num_devices": 40, "devices_per_round": 24, "samples_per_device": 8}
    return RunConfig.from_dict({**base, **changes})


def test_measured_mode_vmaps_unless_the_stacked_step_is_clearly_slower() -> None:
    assert measured_pack_mode(sequential_s=0.002, vmap_s=0.001)[0] == "vmap"
    assert measured_pack_mode(sequential_s=0.001, vmap_s=0.001 * VMAP_TOLERANCE)[0] == "vmap"  # a tie: vmap
    mode, why = measured_pack_mode(sequential_s=0.001, vmap_s=0.002)
    assert mode == "sequential" and "2.0x slower" in why and "1.00 ms" in why


def test_where_each_device_uploads_alone_vmap_must_be_clearly_faster() -> None:
    """FedBuff's vmapped packs store each device's update: a tie, or a small gain, trains them back to back."""
    assert measured_pack_mode(sequential_s=0.001, vmap_s=0.001, presums=False)[0] == "sequential"
    mode, why = measured_pack_mode(sequential_s=0.0011, vmap_s=0.001, presums=False)
    assert mode == "sequential" and "each device uploading alone" in why
    assert measured_pack_mode(sequential_s=0.001 * UNSUMMED_VMAP_MARGIN, vmap_s=0.001, presums=False)[0] == "vmap"
    assert measured_pack_mode(sequential_s=0.003, vmap_s=0.001, presums=False)[0] == "vmap"


@pytest.mark.parametrize(
    ("model", "workers", "timings", "size", "mode"),
    [
        ("mlp", {"cpu0@h": 1, "cpu1@h": 1}, (0.002, 0.001), 6, "vmap"),
        ("cnn", {"cpu0@h": 1, "cpu1@h": 1}, (0.010, 0.020), 6, "sequential"),
        ("cnn", {"gpu0@h": 2}, None, 6, "vmap"),  # GPU workers: nothing timed here, the rule decides
        ("resnet18", {"gpu0@h": 1, "gpu1@h": 1, "gpu2@h": 1}, None, 4, "sequential"),  # refused
    ],
)
def test_auto_is_resolved_at_submit_and_the_choice_noted(
    model: str, workers: dict[str, int], timings: tuple[float, float] | None, size: int, mode: str
) -> None:
    def timer(config: RunConfig, data: object, pack: int) -> tuple[float, float]:
        assert timings is not None, "GPU workers or a refused vmap: nothing is timed"
        assert pack == size
        return timings

    config = _config(model=model, pack_size="auto", pack_mode="auto")
    resolved = resolve_packing(config, load_federated(data_spec(config)), lambda: workers, timer)
    assert (resolved.packing.pack_size, resolved.packing.pack_mode) == (size, mode)
    assert resolved.packing.pack_choice.startswith(f"pack_size {size}: 24 devices, ")
    assert f"pack_mode {mode}: " in resolved.packing.pack_choice
    assert ("timed" in resolved.packing.pack_choice) == (timings is not None)
    assert RunConfig.from_dict(resolved.to_dict()) == resolved  # the stored config reads back


TIMED_CHOICE = re.compile(r"pack_mode (\w+): timed ([\d.]+) ms a device's update back to back, ([\d.]+) ms vmapped")


def test_the_default_is_auto_and_each_submit_times_its_choice(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The digits MLP of the demo, timed for real by two submits, each with a cache of its own: each makes the
    choice the rule makes of the times it reports. (Which way wins depends on the CPU: on some 2-core VMs the
    two ways time within 10 % of each other, and either may come out.)"""
    config = RunConfig.from_dict({"dataset": "digits", "model": "mlp", "num_devices": 40, "devices_per_round": 20})
    assert (config.packing.pack_size, config.packing.pack_mode) == ("auto", "auto")
    data = load_federated(data_spec(config))
    chosen = []
    for attempt in range(2):
        monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / str(attempt)))
        chosen.append(resolve_packing(config, data, lambda: {"cpu0@h": 1, "cpu1@h": 1}))
    assert not any("remembered" in c.packing.pack_choice for c in chosen)
    for resolved in chosen:
        assert resolved.packing.pack_size == 5
        timed = TIMED_CHOICE.search(resolved.packing.pack_choice)
        assert timed is not None, resolved.packing.pack_choice
        mode, sequential_ms, vmap_ms = timed.group(1), float(timed.group(2)), float(timed.group(3))
        assert resolved.packing.pack_mode == mode
        if abs(vmap_ms / sequential_ms - VMAP_TOLERANCE) > 0.02:  # the times as printed, rounded: off the edge
            assert mode == measured_pack_mode(sequential_ms / 1000, vmap_ms / 1000)[0]


def test_a_single_device_per_task_is_not_timed() -> None:
    config = _config(pack_size=1)
    resolved = resolve_packing(config, load_federated(data_spec(config)), lambda: {"cpu0@h": 1}, _never_timed)
    assert (resolved.packing.pack_size, resolved.packing.pack_mode) == (1, "sequential")


def _never_timed(config: RunConfig, data: object, pack: int) -> tuple[float, float]:
    raise AssertionError("a pack of one has no mode to time")


def test_an_explicit_choice_is_kept_as_given() -> None:
    config = _config(pack_size=3, pack_mode="sequential")
    assert resolve_packing(config, load_federated(data_spec(config)), lambda: {"gpu0@h": 1}) == config


def test_a_timed_mode_is_remembered_per_config_on_this_machine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Timed once: the same config again gets the same choice untimed; another batch size is timed anew;
    a cache that cannot be read only means timing again."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    timed: list[int] = []

    def timer(config: RunConfig, data: object, pack: int) -> tuple[float, float]:
        timed.append(config.training.local_batch_size)
        return 0.002, 0.001

    config = _config(model="mlp")
    data = load_federated(data_spec(config))
    workers = {"cpu0@h": 1, "cpu1@h": 1}
    first = resolve_packing(config, data, lambda: workers, timer)
    again = resolve_packing(replace(config, name="renamed", rounds=9), data, lambda: workers, timer)
    batch_size = config.training.local_batch_size
    assert timed == [batch_size]
    assert (
        (again.packing.pack_size, again.packing.pack_mode)
        == (first.packing.pack_size, first.packing.pack_mode)
        == (6, "vmap")
    )
    assert "remembered from an earlier submit" in again.packing.pack_choice and "timed" in again.packing.pack_choice
    other = config.with_keys(local_batch_size=batch_size + 1)
    resolve_packing(other, load_federated(data_spec(other)), lambda: workers, timer)
    assert timed == [batch_size, batch_size + 1]
    (tmp_path / "fedqueue" / "pack_modes.json").write_text("{not json")
    resolve_packing(config, data, lambda: workers, timer)
    assert len(timed) == 3
    assert json.loads((tmp_path / "fedqueue" / "pack_modes.json").read_text())  # written whole again


def _burning(seconds: float, method: Callable[..., Any]) -> Callable[..., Any]:
    """`method`, after `seconds` of this thread's CPU time (what the trial counts)."""

    def slow(self: StackedPack) -> Any:
        until = time.thread_time() + seconds
        while time.thread_time() < until:
            pass
        return method(self)

    return slow


@pytest.mark.parametrize(
    ("mode", "handled"),
    [({}, "weighted_delta_sum"), ({"mode": "fedbuff", "concurrency": 4, "buffer_size": 4}, "outcomes")],
)
def test_the_trial_counts_what_a_vmapped_pack_does_with_its_weights(
    mode: dict[str, object], handled: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A big state's pre-sum (FedAvg) or its taking apart (FedBuff) costs a vmapped pack per pack, not per
    step: a trial that timed only the steps chose vmap for a state of millions of floats, where it lost."""
    config = _config(model="mlp", **mode)
    data = load_federated(data_spec(config))
    monkeypatch.setattr(StackedPack, handled, _burning(0.4, getattr(StackedPack, handled)))
    sequential_s, vmap_s = time_pack_modes(config, data, 4)
    assert vmap_s >= 0.4 / 4  # spread over the pack's 4 devices
    assert sequential_s < 0.4 / 4
    assert measured_pack_mode(sequential_s, vmap_s)[0] == "sequential"


@pytest.mark.parametrize("shared", [True, False])
def test_the_trial_costs_a_blob_as_a_worker_makes_it_and_leaves_nothing_behind(
    shared: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file written into shared memory where workers use it, else the bytes encoded and hashed for the broker."""
    import torch

    from fedqueue.fl.packs import trial

    monkeypatch.setenv("FEDQUEUE_BLOB_SHM_DIR", str(tmp_path))
    monkeypatch.setenv("FEDQUEUE_BLOB_SHM", "auto" if shared else "off")
    made: list[str] = []

    def write_file(state: dict[str, torch.Tensor], out: BinaryIO) -> None:
        made.append("file")
        out.write(b"x")

    def encode_bytes(state: dict[str, torch.Tensor]) -> bytes:
        made.append("bytes")
        return encode_state(state)

    monkeypatch.setattr(trial, "write_state", write_file)
    monkeypatch.setattr(trial, "encode_state", encode_bytes)
    start = {"w": torch.zeros(3, 4)}
    pack = StackedPack(
        parameters={"w": torch.ones(2, 3, 4)}, global_state=start, samples=[5, 7], losses=[0.0] * 2, steps=[1] * 2
    )

    alone, together = trial._state_seconds(start, pack, presums=True)

    assert alone >= 0 and together >= 0
    # In shared memory one write first, untimed: the timed ones go over its file, as workers' over a freed one.
    assert made == (["file", "file", "file"] if shared else ["bytes", "bytes"])
    assert list(tmp_path.iterdir()) == []
