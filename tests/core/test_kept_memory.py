"""A worker process keeps freed memory for reuse (fedqueue.core.process.kept_memory), measured in fresh processes:
a 64 MiB block freed stays in the process (its resident size) where glibc would have handed it back."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from fedqueue.config import Settings
from fedqueue.errors import ConfigError

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc")

BLOCK_MB = 64

# Allocates, touches and frees one block through libc itself; prints what stayed resident, in MiB.
MEASURE = textwrap.dedent(
    f"""
    import ctypes, json, os
    libc = ctypes.CDLL(None)
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    page = os.sysconf("SC_PAGE_SIZE")
    def resident():
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * page / 2**20
    before = resident()
    block = libc.malloc({BLOCK_MB} << 20)
    ctypes.memset(block, 1, {BLOCK_MB} << 20)
    touched = resident() - before
    libc.free(block)
    print(json.dumps({{"kept": KEPT, "touched_mb": touched, "left_mb": resident() - before}}))
    """
)


def _measured(setup: str, env: dict[str, str] | None = None) -> dict[str, float]:
    script = setup + "\n" + MEASURE
    clean = {name: value for name, value in os.environ.items() if not name.startswith("MALLOC_")}
    clean.pop("GLIBC_TUNABLES", None)
    clean.pop("LD_PRELOAD", None)
    done = subprocess.run(
        [sys.executable, "-c", script], env={**clean, **(env or {})}, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    measured: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return measured


def _kept(limit_mb: int) -> str:
    return f"from fedqueue.core.process.kept_memory import keep_freed_memory\nKEPT = keep_freed_memory({limit_mb})"


def test_a_freed_block_stays_in_the_process_within_the_limit() -> None:
    kept = _measured(_kept(256))
    assert kept["kept"] is True
    assert kept["touched_mb"] >= BLOCK_MB - 1
    assert kept["left_mb"] >= BLOCK_MB - 1  # the next 64 MiB tensor reuses these pages


def test_without_it_or_past_its_limit_the_block_goes_back() -> None:
    default = _measured(_kept(0))
    assert default["kept"] is False
    assert default["left_mb"] < 8
    beyond = _measured(_kept(16))  # a free top larger than the limit is given back, as glibc does
    assert beyond["kept"] is True
    assert beyond["left_mb"] < 8


def test_the_users_own_tuning_of_the_allocator_is_left_as_it_is() -> None:
    tuned = _measured(_kept(256), env={"MALLOC_TRIM_THRESHOLD_": "0"})
    assert tuned["kept"] is False
    assert tuned["left_mb"] < 8


def test_a_worker_process_keeps_freed_memory_from_its_start() -> None:
    """What a `celery worker` process loads (fedqueue.queue.worker_app) sets it up from its settings."""
    env = {"FEDQUEUE_BROKER_URL": "redis://127.0.0.1:6379/15", "FEDQUEUE_DATABASE_URL": "sqlite:///unused.db"}
    setup = "import fedqueue.queue.worker_app\nKEPT = True"
    assert _measured(setup, env)["left_mb"] >= BLOCK_MB - 1
    off = _measured(setup, {**env, "FEDQUEUE_WORKER_FREED_MEMORY_MB": "0"})
    assert off["left_mb"] < 8


@pytest.mark.parametrize("value", ["-1", "2048", "lots"])
def test_a_bad_limit_is_refused_naming_the_variable(value: str) -> None:
    with pytest.raises(ConfigError, match="^FEDQUEUE_WORKER_FREED_MEMORY_MB: "):
        Settings.from_env({"FEDQUEUE_WORKER_FREED_MEMORY_MB": value})
    assert Settings.from_env({"FEDQUEUE_WORKER_FREED_MEMORY_MB": "0"}).worker_freed_memory_mb == 0
