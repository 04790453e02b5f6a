"""How `fedqueue worker` lays out processes: pure logic, no processes started."""

from __future__ import annotations

import pytest

from fedqueue.config import Settings
from fedqueue.errors import ConfigError
from fedqueue.queue.workers import detect_gpus, named, plan_workers, worker_command


def test_one_pinned_process_per_gpu_named_after_it() -> None:
    specs = plan_workers(["0", "3"], procs=None, slots=2)
    assert [(s.name, s.cuda_visible_devices, s.slots) for s in specs] == [("gpu0", "0", 2), ("gpu3", "3", 2)]


def test_cpu_host_gets_one_process_per_core_or_procs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("os.cpu_count", lambda: 3)
    assert [s.name for s in plan_workers([], procs=None, slots=1)] == ["cpu0", "cpu1", "cpu2"]
    specs = plan_workers([], procs=2, slots=1)
    assert [s.name for s in specs] == ["cpu0", "cpu1"]
    assert all(s.cuda_visible_devices == "" for s in specs)  # a CPU worker sees no GPU


def test_bad_counts_are_refused() -> None:
    with pytest.raises(ConfigError, match="--slots"):
        plan_workers([], procs=1, slots=0)
    with pytest.raises(ConfigError, match="--procs"):
        plan_workers([], procs=0, slots=1)


def test_gpus_come_from_cuda_visible_devices(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,2")
    assert detect_gpus() == ["1", "2"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert detect_gpus() == []


def test_worker_command_uses_threads_pool_and_bounded_slots() -> None:
    spec = plan_workers(["1"], procs=None, slots=4)[0]
    command = worker_command(spec, Settings(broker_url="redis://127.0.0.1:1/0", key_prefix="p"))
    joined = " ".join(command)
    assert "--pool threads" in joined and "--concurrency 4" in joined
    # The control queue first: aggregations are read before device tasks.
    assert "--hostname gpu1@%h" in joined and "--queues p.control,p.devices" in joined
    assert "solo" not in joined


def test_gpu_groups_for_models_larger_than_one_gpu() -> None:
    specs = plan_workers(["0", "1", "2", "3"], procs=None, slots=1, gpus_per_worker=2)
    assert [(s.name, s.cuda_visible_devices) for s in specs] == [("gpu0-1", "0,1"), ("gpu2-3", "2,3")]
    by_uuid = plan_workers(["GPU-a", "GPU-b"], procs=None, slots=1, gpus_per_worker=2)
    assert [(s.name, s.cuda_visible_devices) for s in by_uuid] == [("gpu0", "GPU-a,GPU-b")]
    assert [s.name for s in plan_workers(["4"], procs=None, slots=1, gpus_per_worker=1)] == ["gpu4"]


@pytest.mark.parametrize(
    ("gpus", "procs", "per_worker", "message"),
    [
        (["0", "1", "2"], None, 2, "3 GPUs do not split into groups of 2"),
        ([], None, 2, "needs GPUs"),
        (["0", "1"], 2, 2, "needs GPUs"),
        (["0"], None, 0, "must be at least 1"),
    ],
)
def test_bad_gpu_groups_are_refused(gpus: list[str], procs: int | None, per_worker: int, message: str) -> None:
    with pytest.raises(ConfigError, match=f"--gpus-per-worker: .*{message}"):
        plan_workers(gpus, procs=procs, slots=1, gpus_per_worker=per_worker)


def test_several_processes_per_gpu_each_pinned_to_it() -> None:
    specs = plan_workers(["0", "3"], procs=None, slots=2, procs_per_gpu=2)
    assert [(s.name, s.cuda_visible_devices, s.slots) for s in specs] == [
        ("gpu0-0", "0", 2),
        ("gpu0-1", "0", 2),
        ("gpu3-0", "3", 2),
        ("gpu3-1", "3", 2),
    ]
    command = " ".join(worker_command(specs[1], Settings(broker_url="redis://127.0.0.1:1/0", key_prefix="p")))
    assert "--hostname gpu0-1@%h" in command
    assert [s.name for s in plan_workers(["0"], procs=None, slots=1, procs_per_gpu=1)] == ["gpu0"]


@pytest.mark.parametrize(
    ("gpus", "procs", "per_gpu", "per_worker", "message"),
    [
        ([], None, 2, 1, "needs GPUs"),
        (["0"], 2, 2, 1, "needs GPUs"),
        (["0", "1"], None, 2, 2, "takes them whole"),
        (["0"], None, 0, 1, "must be at least 1"),
    ],
)
def test_bad_processes_per_gpu_are_refused(
    gpus: list[str], procs: int | None, per_gpu: int, per_worker: int, message: str
) -> None:
    with pytest.raises(ConfigError, match=f"--procs-per-gpu: .*{message}"):
        plan_workers(gpus, procs=procs, slots=1, gpus_per_worker=per_worker, procs_per_gpu=per_gpu)


def test_one_worker_can_be_named_and_several_cannot() -> None:
    """`--name gpu1`: a container that sees its GPU as GPU 0 still names the worker after the host's GPU."""
    (spec,) = named(plan_workers(["0"], None, 2), "gpu1")
    assert (spec.name, spec.cuda_visible_devices, spec.slots) == ("gpu1", "0", 2)
    assert named(plan_workers([], 2, 1), None) == plan_workers([], 2, 1)
    with pytest.raises(ConfigError, match="--name: names one worker process, but this host plans 2"):
        named(plan_workers([], 2, 1), "cpu")
    with pytest.raises(ConfigError, match="--name: letters, digits"):
        named(plan_workers(["0"], None, 1), "gpu 1@x")
