"""CUDA_VISIBLE_DEVICES as every part of fedqueue reads it: the launcher, the sampler, both kinds' workers."""

from __future__ import annotations

import pytest

from fedqueue.core.process.gpus import visible_gpus


@pytest.mark.parametrize(
    ("value", "gpus"),
    [
        ("", []),  # a CPU worker: the launcher hides every GPU
        ("-1", []),
        (" -1 ", []),
        (" -1,0", []),  # CUDA reads no further than a negative entry
        ("0,2,-1,1", ["0", "2"]),
        ("3", ["3"]),
        (" 1 , 2 ", ["1", "2"]),
        ("1,,2,", ["1", "2"]),  # blank entries are skipped
        ("GPU-8f3c2a1e,GPU-12ab", ["GPU-8f3c2a1e", "GPU-12ab"]),
    ],
)
def test_the_gpus_the_variable_names(value: str, gpus: list[str]) -> None:
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": value}) == gpus


def test_unset_means_every_gpu_of_the_host_not_none_of_them() -> None:
    assert visible_gpus({}) is None


def test_the_process_environment_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "5,6")
    assert visible_gpus() == ["5", "6"]
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert visible_gpus() is None
