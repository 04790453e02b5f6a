"""Utilization samples: the store functions (SQLite and Postgres) and the worker's sampler thread."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pytest

from fedqueue.core.database import open_store
from fedqueue.core.process import utilization
from fedqueue.core.process.utilization import CpuProbe, GpuProbe, Sampler, make_probe, pinned_gpu
from fedqueue.store.utilization import Sample, record_samples, samples_between


def test_samples_round_trip_within_a_window_and_for_chosen_workers(database_url: str) -> None:
    store = open_store(database_url, migrate=True)
    name = f"w-{uuid.uuid4().hex[:8]}@host"  # the Postgres database is shared by the session's tests
    other = f"x-{uuid.uuid4().hex[:8]}@host"
    rows = [Sample(name, 1, "cpu", 1000.0 + second, 10.0 * second, 2**33 + second) for second in range(5)]
    rows += [Sample(name, 2, "cuda:3", 1002.5, 99.5, 2**34), Sample(other, 1, "cpu", 1001.0, 5.0, 1)]
    record_samples(store, rows)
    record_samples(store, [])  # nothing to write is not an error

    found = samples_between(store, 1001.0, 1003.0, {(name, 1), (name, 2)})
    assert [(s.pid, s.sampled_at) for s in found] == [(1, 1001.0), (1, 1002.0), (2, 1002.5), (1, 1003.0)]
    assert found[2] == Sample(name, 2, "cuda:3", 1002.5, 99.5, 2**34)  # big memory values survive (BIGINT)
    assert [s.worker for s in samples_between(store, 1000.0, 1004.0, {(other, 1)})] == [other]
    assert samples_between(store, 1000.0, 1004.0, set()) == []
    everyone = samples_between(store, 1000.0, 1004.0)
    assert {(s.worker, s.pid) for s in everyone} >= {(name, 1), (name, 2), (other, 1)}
    store.close()


class CountingProbe:
    """Readings 1, 2, 3, ... as utilization; every third read fails, as a flaky driver might."""

    device_used = "cpu"

    def __init__(self) -> None:
        self.reads = 0
        self.good: list[float] = []
        self.closed = False

    def read(self) -> tuple[float, int]:
        self.reads += 1
        if self.reads % 3 == 0:
            raise RuntimeError("driver hiccup")
        self.good.append(float(self.reads))
        return float(self.reads), 1000 + self.reads

    def close(self) -> None:
        self.closed = True


def wait_for(condition: object, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.02)


def test_sampler_waits_for_the_schema_keeps_its_readings_and_writes_them_all(tmp_path: Path) -> None:
    database = tmp_path / "later.db"
    url = f"sqlite:///{database}"
    probe = CountingProbe()
    sampler = Sampler(url, "cpu0@host", interval_s=0.02, flush_every_s=0.1, probe_factory=lambda: probe).start()
    wait_for(lambda: probe.reads >= 10)
    assert not database.exists()  # the sampler never creates the store: the first submit does
    created_at = time.time()
    store = open_store(url, migrate=True)
    wait_for(lambda: any(s.sampled_at > created_at for s in samples_between(store, 0, float("inf"))))
    sampler.stop()
    assert probe.closed
    stored = samples_between(store, 0, float("inf"))
    # Every good reading, those taken before the schema existed too; the failed reads are skipped.
    assert [s.utilization for s in stored] == probe.good
    assert stored[0].sampled_at < created_at
    assert {(s.worker, s.device_used) for s in stored} == {("cpu0@host", "cpu")}
    assert [s.memory_bytes for s in stored] == [1000 + int(value) for value in probe.good]


def test_sampler_outlives_an_unreachable_store(tmp_path: Path) -> None:
    folder = tmp_path / "not-yet"
    url = f"sqlite:///{folder / 'store.db'}"
    probe = CountingProbe()
    sampler = Sampler(url, "cpu1@host", interval_s=0.02, flush_every_s=0.05, probe_factory=lambda: probe).start()
    wait_for(lambda: probe.reads >= 10)
    folder.mkdir()
    store = open_store(url, migrate=True)
    wait_for(lambda: len(samples_between(store, 0, float("inf"))) >= 7)  # the early readings arrive
    sampler.stop()
    assert [s.utilization for s in samples_between(store, 0, float("inf"))] == probe.good


def test_stop_without_a_store_returns_promptly(tmp_path: Path) -> None:
    sampler = Sampler(
        f"sqlite:///{tmp_path / 'never.db'}", "cpu2@host", interval_s=0.02, probe_factory=CountingProbe
    ).start()
    time.sleep(0.1)
    began = time.monotonic()
    sampler.stop()
    assert time.monotonic() - began < 2 and not (tmp_path / "never.db").exists()


def test_cpu_probe_reads_this_process() -> None:
    """The probe's CPU % equals what this process used over the same span, however busy the machine is."""
    probe = CpuProbe()
    began, began_cpu = time.monotonic(), time.process_time()
    while time.process_time() - began_cpu < 0.3 and time.monotonic() - began < 30:
        sum(range(1000))  # keep one core busy, until this process has had 0.3 s of it
    cpu, rss = probe.read()
    used = 100 * (time.process_time() - began_cpu) / (time.monotonic() - began)
    assert cpu > 0 and cpu == pytest.approx(used, abs=10)
    assert rss > 10 * 2**20
    assert probe.device_used == "cpu"


@pytest.mark.parametrize("visible", ["", "-1", " -1,0"])
def test_no_gpu_when_the_launcher_hides_them(monkeypatch: pytest.MonkeyPatch, visible: str) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    assert pinned_gpu() is None
    assert isinstance(make_probe(), CpuProbe)


def test_a_gpu_that_nvml_cannot_read_falls_back_to_the_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(utilization, "pinned_gpu", lambda: "0")
    try:
        GpuProbe("0").close()
        nvml_works = True
    except Exception:
        nvml_works = False
    probe = make_probe()
    if nvml_works:  # a host with a driver: the physical GPU named by CUDA_VISIBLE_DEVICES
        assert isinstance(probe, GpuProbe) and probe.device_used == "cuda:0"
    else:
        assert isinstance(probe, CpuProbe) and probe.device_used == "cpu"
    probe.close()
