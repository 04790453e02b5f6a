"""A run's table of rounds (versions) folded to its first and last rows, with `--all` for every row: in `status`,
`resume` of an ended run, and the table `fedqueue run` ends with."""

from __future__ import annotations

import re
import uuid
from pathlib import Path

import pytest

from fedqueue.config import Settings
from fedqueue.core.database import open_store
from fedqueue.fl.store.results import add_round, claim_round, complete_round
from tests.conftest import running_workers
from tests.store.test_store import round_row
from tests.support.cli_inputs import cli_env
from tests.support.cli_runner import fedqueue_cli

FEDBUFF_TOML = (
    'mode = "fedbuff"\nnum_devices = 12\ndevices_per_round = 4\nconcurrency = 4\nbuffer_size = 1\nmax_model_version = 14\n'
    "local_iters = 1\nlocal_batch_size = 8\npack_size = 1\nseed = 3\n"
)


def table_rows(output: str) -> list[str]:
    """The first cells of the table's body rows: round or version numbers, and the fold's "… N …"."""
    return [match.group(1) for match in re.finditer(r"^│ +(\d+|… \d+ …) │", output, flags=re.MULTILINE)]


def test_status_of_a_200_round_run_shows_its_first_and_last_rounds_and_all_of_them_with_all(tmp_path: Path) -> None:
    database = f"sqlite:///{tmp_path / 'store.db'}"
    store = open_store(database, migrate=True)
    run_id = uuid.uuid4().hex[:12]
    try:
        store.create_run(run_id, "long", {"dataset": "digits", "model": "mlp"}, 200, kind="fl")
        for index in range(1, 201):
            assert add_round(store, round_row(run_id, index))
            assert claim_round(store, run_id, index, "agg", stale_before=0.0)
            assert complete_round(store, run_id, index, "agg", aggregate_ms=1.0, accuracy=index / 1000)
        store.finish_run(run_id, "finished")
    finally:
        store.close()
    env = {**cli_env(Settings(database_url=database)), "COLUMNS": "100"}

    folded = fedqueue_cli("status", run_id, cwd=tmp_path, env=env)
    assert folded.returncode == 0, folded.stderr
    assert table_rows(folded.stdout) == ["1", "2", "3", "4", "5", "… 190 …", "196", "197", "198", "199", "200"]
    assert f"190 rounds (6–195) left out: fedqueue status {run_id} --all shows every one" in folded.stdout
    assert "final accuracy 0.2000" in folded.stdout
    assert len(folded.stdout.splitlines()) < 30, folded.stdout

    every = fedqueue_cli("status", run_id, "--all", cwd=tmp_path, env=env)
    assert table_rows(every.stdout) == [str(index) for index in range(1, 201)] and "left out" not in every.stdout
    # `resume` of an ended run prints the same table, with the same option.
    resumed = fedqueue_cli("resume", run_id, "--all", cwd=tmp_path, env=env)
    assert resumed.returncode == 0 and f"run {run_id} is already finished" in resumed.stdout
    assert table_rows(resumed.stdout) == [str(index) for index in range(1, 201)]
    assert "… 190 …" in fedqueue_cli("resume", run_id, cwd=tmp_path, env=env).stdout


# Two whole `fedqueue run` commands on real workers: a command session, run apart from make test.
@pytest.mark.sessions
def test_the_table_a_run_ends_with_is_folded_and_whole_with_all(settings: Settings, tmp_path: Path) -> None:
    config = tmp_path / "fedbuff.toml"
    config.write_text(FEDBUFF_TOML)
    env = {**cli_env(settings), "COLUMNS": "100"}
    with running_workers(settings, procs=1, log_dir=tmp_path / "logs"):
        ended = fedqueue_cli("run", str(config), cwd=tmp_path, env=env, timeout=240)
        assert ended.returncode == 0, ended.stdout + ended.stderr
        assert table_rows(ended.stdout) == ["1", "2", "3", "4", "5", "… 4 …", "10", "11", "12", "13", "14"]
        assert "4 versions (6–9) left out: fedqueue status " in ended.stdout

        whole = fedqueue_cli("run", str(config), "--all", cwd=tmp_path, env=env, timeout=240)
        assert whole.returncode == 0, whole.stdout + whole.stderr
        assert table_rows(whole.stdout) == [str(version) for version in range(1, 15)]
