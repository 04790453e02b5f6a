"""The submit's torch work apart (fl/submit/prepare.py): the same run as in this process, in a process of its own,
so the command that follows the run (`fedqueue run`) never loads torch."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from fedqueue.errors import ConfigError
from fedqueue.fl.submit.prepare import prepare, prepare_apart
from tests.support.helpers import small_config

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "plugins"
SCALE = {"mode": "fedbuff", "num_devices": 1_000_000, "concurrency": 20, "buffer_size": 5, "max_model_version": 2,
         "partition": "dirichlet_fixed_per_device", "client_data_size": 20, "pack_size": "auto", "pack_mode": "auto"}  # fmt: skip

# A process that prepares a run apart and builds its clock (what FedBuff's start reads), then says whether it
# loaded torch, and what it got.
PROBE = """
import hashlib, json, sys
from fedqueue.fl.config import RunConfig
from fedqueue.fl.strategy.trip_clock import run_clock
from fedqueue.fl.submit.prepare import prepare_apart
config = RunConfig.from_dict(json.loads(sys.argv[1]))
prepared = prepare_apart(config, lambda: {"worker@a": 2})
run_clock(prepared.config).trip_seconds(1, 999_999)
print(json.dumps({"torch": "torch" in sys.modules, "config": prepared.config.to_dict(),
                  "state": hashlib.sha256(prepared.state).hexdigest()}))
"""


def test_apart_is_the_same_run_and_the_submitting_process_loads_no_torch(tmp_path: Path) -> None:
    import hashlib

    config = small_config(**SCALE)
    env = {"PATH": "/usr/bin:/bin", "XDG_CACHE_HOME": str(tmp_path)}  # the pack trial's cache: fresh
    probe = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(config.to_dict())], env=env, capture_output=True, text=True,
        timeout=240, check=False, cwd=Path(__file__).resolve().parents[2],
    )  # fmt: skip
    assert probe.returncode == 0, probe.stderr
    apart = json.loads(probe.stdout)
    assert apart["torch"] is False
    here = prepare(config, lambda: {"worker@a": 2})
    assert apart["state"] == hashlib.sha256(here.state).hexdigest()
    # The pack trial's timings may pick either mode; what else it decides is the same.
    assert apart["config"]["pack_size"] == here.config.packing.pack_size
    for key in ("partition", "client_data_size", "num_devices", "seed", "mode"):
        assert apart["config"][key] == here.config.to_dict()[key]


def test_a_plugin_that_fails_apart_is_the_same_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(EXAMPLES))  # the spawned process gets this process's path
    config = small_config(local_step="fedqueue_examples.fedprox:fedprox_step", plugin={"mu": -1})
    with pytest.raises(ConfigError, match="^plugin: mu must be") as apart:
        prepare_apart(config, dict)
    with pytest.raises(ConfigError) as here:
        prepare(config, dict)
    assert str(apart.value) == str(here.value)
