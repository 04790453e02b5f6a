"""A worker's device, sampled once a second by a daemon thread and stored in small batches.

On a GPU worker: the GPU's utilization and used memory through NVML (`nvidia-ml-py`).
On a CPU worker: the worker process's CPU% (of one core) and resident memory through psutil.
Sampling must never hurt the worker: every failure is logged and the thread goes on.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from fedqueue.core.process.gpus import visible_gpus
from fedqueue.store import Store
from fedqueue.store.db import make_engine
from fedqueue.store.utilization import Sample, record_samples

log = logging.getLogger(__name__)

INTERVAL_S = 1.0
FLUSH_EVERY_S = 5.0
# Kept while the store is not ready (no run submitted yet); the oldest are dropped beyond this.
MAX_BUFFERED = 3600
DEVICE_LABEL_MAX = 32  # the store's device_used column


class Probe(Protocol):
    device_used: str

    def read(self) -> tuple[float, int]:
        """(utilization percent, memory bytes) now."""
        ...

    def close(self) -> None: ...


class CpuProbe:
    """This process's CPU% (100 = one core busy) and resident set size."""

    device_used = "cpu"

    def __init__(self) -> None:
        import psutil

        self._process = psutil.Process()
        # The first reading has no interval to measure over; take it now so the next one is real.
        self._process.cpu_percent(None)

    def read(self) -> tuple[float, int]:
        return float(self._process.cpu_percent(None)), int(self._process.memory_info().rss)

    def close(self) -> None:
        pass


class GpuProbe:
    """One physical GPU through NVML: percent of time a kernel ran, and memory used on the board."""

    def __init__(self, physical: str) -> None:
        import pynvml  # from nvidia-ml-py; imported only on a host with a GPU

        self._nvml: Any = pynvml
        pynvml.nvmlInit()
        try:
            # NVML numbers GPUs physically, as CUDA_VISIBLE_DEVICES does: "3" is the host's GPU 3.
            if physical.isdigit():
                self._handle = pynvml.nvmlDeviceGetHandleByIndex(int(physical))
            else:
                self._handle = pynvml.nvmlDeviceGetHandleByUUID(physical)
        except Exception:
            pynvml.nvmlShutdown()
            raise
        self.device_used = f"cuda:{physical}"[:DEVICE_LABEL_MAX]

    def read(self) -> tuple[float, int]:
        rates = self._nvml.nvmlDeviceGetUtilizationRates(self._handle)
        memory = self._nvml.nvmlDeviceGetMemoryInfo(self._handle)
        return float(rates.gpu), int(memory.used)

    def close(self) -> None:
        self._nvml.nvmlShutdown()


def pinned_gpu() -> str | None:
    """The physical GPU this worker trains on (as CUDA_VISIBLE_DEVICES names it), or None on a CPU worker."""
    visible = visible_gpus()
    if visible == []:
        return None  # GPUs hidden on purpose: do not even load torch's CUDA check
    import torch

    if not torch.cuda.is_available():
        return None
    return visible[0] if visible else "0"


def make_probe() -> Probe:
    gpu = pinned_gpu()
    if gpu is not None:
        try:
            return GpuProbe(gpu)
        except Exception as err:  # no nvidia-ml-py, or NVML without a driver: still sample something
            log.warning("GPU %s cannot be sampled through NVML (%s); sampling this process's CPU instead", gpu, err)
    return CpuProbe()


class Sampler:
    """Reads a probe every `interval_s` and writes the readings every `flush_every_s`."""

    def __init__(
        self,
        database_url: str,
        worker: str,
        *,
        interval_s: float = INTERVAL_S,
        flush_every_s: float = FLUSH_EVERY_S,
        probe_factory: Callable[[], Probe] = make_probe,
    ) -> None:
        self._database_url = database_url
        self._worker = worker
        self._pid = os.getpid()
        self._interval_s = interval_s
        self._flush_every_s = flush_every_s
        self._probe_factory = probe_factory
        self._stop = threading.Event()
        self._buffer: list[Sample] = []
        self._store: Store | None = None
        self._warned: set[str] = set()
        self._thread = threading.Thread(target=self._run, name="fedqueue-sampler", daemon=True)

    def start(self) -> Sampler:
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop sampling and write what is buffered (the thread does the last write)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout_s)

    def _run(self) -> None:
        try:
            probe = self._probe_factory()
        except Exception:
            log.exception("device sampler could not start; this worker's utilization is not recorded")
            return
        last_flush = time.monotonic()
        try:
            while not self._stop.wait(self._interval_s):
                self._sample(probe)
                if time.monotonic() - last_flush >= self._flush_every_s:
                    self._flush()
                    last_flush = time.monotonic()
            self._flush()
        finally:
            probe.close()
            if self._store is not None:
                self._store.close()

    def _sample(self, probe: Probe) -> None:
        try:
            utilization, memory = probe.read()
        except Exception as err:
            self._warn_once("read", f"device sample failed: {err}")
            return
        self._buffer.append(
            Sample(
                worker=self._worker,
                pid=self._pid,
                device_used=probe.device_used,
                sampled_at=time.time(),
                utilization=utilization,
                memory_bytes=memory,
            )
        )
        del self._buffer[:-MAX_BUFFERED]

    def _flush(self) -> None:
        if not self._buffer:
            return

        store = self._open()
        if store is None:
            return  # no schema yet: keep the readings for a later flush
        try:
            record_samples(store, self._buffer)
        except Exception as err:  # a locked or unreachable database: keep them and try again
            self._warn_once("write", f"utilization samples not stored yet: {err}")
            return
        self._buffer.clear()

    def _open(self) -> Store | None:
        if self._store is not None:
            return self._store
        from sqlalchemy import inspect
        from sqlalchemy.engine import make_url

        try:
            url = make_url(self._database_url)
            # Connecting would create an empty SQLite file; leave that to the first submit.
            if url.get_backend_name() == "sqlite" and url.database and not Path(url.database).exists():
                return None
            engine = make_engine(self._database_url)
        except Exception as err:
            self._warn_once("open", f"utilization store cannot be opened: {err}")
            return None
        try:
            with engine.connect() as connection:
                ready = inspect(connection).has_table("utilization_samples")
        except Exception as err:  # down for now: try again at the next flush
            self._warn_once("open", f"utilization store cannot be reached yet: {err}")
            ready = False
        if not ready:
            engine.dispose()  # one engine per attempt would leak connections over a long wait
            return None
        self._store = Store(engine)
        return self._store

    def _warn_once(self, kind: str, message: str) -> None:
        if kind not in self._warned:
            self._warned.add(kind)
            log.warning("%s", message)
