"""A run whose devices would not fit in this machine's memory is refused at submit, with the number it would need."""

from __future__ import annotations

from pathlib import Path

import pytest

import fedqueue
from fedqueue.config import Settings
from fedqueue.errors import ConfigError
from fedqueue.fl.submit.memory import check_fits, per_device_bytes, processes_here
from tests.support.cli_inputs import cli_env, write_config
from tests.support.cli_runner import fedqueue_cli
from tests.support.helpers import small_config

TOO_MANY = 10**11  # 48 bytes a device in two processes at least: 9.6 TB


def test_the_estimate_counts_what_each_partition_keeps_a_device() -> None:
    assert per_device_bytes(small_config(partition="dirichlet_fixed", client_data_size=20)) == 40 + 8 + 4 * 20
    assert per_device_bytes(small_config(partition="dirichlet_fixed_per_device", client_data_size=20)) == 40 + 8
    assert per_device_bytes(small_config()) == 40 + 8 + 120
    assert per_device_bytes(small_config(clock="fedrevive")) == 72 + 8 + 120


def test_processes_are_this_one_and_the_workers_on_this_machine() -> None:
    import socket

    here = socket.gethostname()
    assert processes_here({f"cpu1@{here}": 1, f"cpu2@{here}": 1, "cpu1@elsewhere": 4}) == 3
    assert processes_here({}) == 2


def test_the_refusal_names_the_need_and_what_there_is() -> None:
    config = small_config(num_devices=1_000_000, partition="dirichlet_fixed_per_device", client_data_size=20)
    check_fits(config, {}, available=96_000_000)  # 48 bytes x 1M x 2 processes: just fits
    with pytest.raises(ConfigError) as refused:
        check_fits(config, {}, available=50 * 2**20)
    assert str(refused.value) == (
        "num_devices: 1,000,000 devices need about 91.6 MiB of memory (48 bytes a device in each of 2 processes),"
        " and this machine has 50.0 MiB available"
    )


def test_a_run_that_would_not_fit_is_refused_at_submit_and_nothing_is_stored(settings: Settings) -> None:
    config = small_config(num_devices=TOO_MANY, partition="dirichlet_fixed_per_device", client_data_size=20)
    with pytest.raises(ConfigError, match=r"^num_devices: 100,000,000,000 devices need about [\d,.]+ GiB of memory"):
        fedqueue.submit(config, settings=settings)
    assert fedqueue.runs(settings) == []


def test_the_command_says_it_in_one_line_and_exits_2(settings: Settings, tmp_path: Path) -> None:
    text = f'num_devices = {TOO_MANY}\npartition = "dirichlet_fixed_per_device"\nclient_data_size = 20\n'
    result = fedqueue_cli("submit", str(write_config(tmp_path, text)), cwd=tmp_path, env=cli_env(settings))
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stderr.startswith("error: num_devices: 100,000,000,000 devices need about")
    assert len(result.stderr.strip().splitlines()) == 1 and result.stdout == ""
    assert fedqueue.runs(settings) == []
