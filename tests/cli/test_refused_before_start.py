"""What the user wrote, refused by `fedqueue run` in one line (exit 2) before anything starts: no Redis, no worker,
no store, no folder made."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from tests.support.cli_inputs import SMALL, cli_env, write_config
from tests.support.cli_runner import fedqueue_cli


def refused(tmp_path: Path, *args: str, **env: str) -> str:
    """`fedqueue run *args` in tmp_path: exit 2, nothing on stdout (nothing started), one line on stderr; that line."""
    result = fedqueue_cli("run", *args, cwd=tmp_path, env=cli_env(**env), timeout=60)
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stdout == ""  # not even "starting embedded Redis and local workers"
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert not (tmp_path / "fedqueue.db").exists()
    return lines[0]


def test_a_buffer_larger_than_concurrency_is_refused(tmp_path: Path) -> None:
    config = write_config(tmp_path, SMALL + 'mode = "fedbuff"\nconcurrency = 4\nbuffer_size = 6\n')
    assert refused(tmp_path, str(config)) == (
        "error: buffer_size: 6 updates per version is more than concurrency = 4 devices training at once;"
        " set buffer_size to at most 4 or raise concurrency"
    )


@pytest.mark.parametrize("text", ["", "\n\n", "# every default, please\n"])
def test_a_config_file_that_sets_nothing_is_refused(tmp_path: Path, text: str) -> None:
    config = write_config(tmp_path, text)
    line = refused(tmp_path, str(config))
    assert line == (
        f"error: config: {str(config)!r} sets nothing, so every setting would be its default;"
        " write the settings to run (e.g. rounds = 10; see examples/)"
    )


def test_a_config_file_that_sets_nothing_is_read_with_overrides(tmp_path: Path) -> None:
    config = write_config(tmp_path, "")
    result = fedqueue_cli("check", str(config), "--set", "rounds=3", cwd=tmp_path, env=cli_env())
    assert result.returncode == 0, result.stderr
    assert "rounds = 3  # --set" in result.stdout.splitlines()


def test_a_plugin_folder_that_does_not_exist_is_refused(tmp_path: Path) -> None:
    missing = str(tmp_path / "nonexistent")
    line = refused(tmp_path, str(write_config(tmp_path, SMALL)), FEDQUEUE_PLUGIN_PATH=missing)
    assert line == f"error: FEDQUEUE_PLUGIN_PATH: folder {missing!r} does not exist"


def test_a_blob_folder_that_could_not_be_made_is_refused_and_nothing_is_made(tmp_path: Path) -> None:
    blobs = tmp_path / "nonexistent" / "blobs"
    line = refused(tmp_path, str(write_config(tmp_path, SMALL)), FEDQUEUE_BLOB_DIR=str(blobs))
    assert line.startswith(f"error: FEDQUEUE_BLOB_DIR: folder {str(blobs)!r} does not exist")
    assert not blobs.parent.exists()


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("sqlite://fedqueue.db", "makes 'fedqueue.db' a host name; a SQLite file takes three slashes"),
        ("sqlite://", "sqlite:// is an in-memory SQLite database, seen only by the process that opens it"),
    ],
)
def test_a_store_url_written_wrong_or_in_memory_is_refused_before_redis_and_workers_start(
    tmp_path: Path, url: str, expected: str
) -> None:
    """Once a 67-line traceback after Redis and the workers had started (two slashes), or a run that waited
    forever on workers writing to stores of their own (in memory)."""
    line = refused(tmp_path, str(write_config(tmp_path, SMALL)), FEDQUEUE_DATABASE_URL=url)
    assert line.startswith("error: FEDQUEUE_DATABASE_URL: ") and expected in line, line


@pytest.mark.parametrize("command", [("up", "-d"), ("worker",), ("submit", "run.toml")])
def test_an_in_memory_store_is_refused_by_every_command_whose_work_outlives_it(
    tmp_path: Path, command: tuple[str, ...]
) -> None:
    write_config(tmp_path, SMALL)
    env = cli_env(FEDQUEUE_DATABASE_URL="sqlite:///:memory:", FEDQUEUE_BROKER_URL="redis://127.0.0.1:1/0")
    if command[0] == "up":
        env.pop("FEDQUEUE_BROKER_URL")  # its own embedded Redis
    result = fedqueue_cli(*command, cwd=tmp_path, env=env, timeout=60)
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stderr.strip().splitlines() == [
        "error: FEDQUEUE_DATABASE_URL: sqlite:///:memory: is an in-memory SQLite database, seen only by the process"
        " that opens it: the workers and later commands would never see the run; use a file (sqlite:///fedqueue.db)"
        " or Postgres"
    ], result.stderr
    assert result.stdout == ""


@pytest.mark.parametrize(
    ("plugin", "expected"),
    [
        (
            "nowhere.nets:build",
            "error: model: cannot import 'nowhere.nets' (ModuleNotFoundError: No module named 'nowhere')",
        ),
        ("broken_nets:build", "error: model: cannot import 'broken_nets' (RuntimeError: no GPU driver in this module)"),
        ("fine_nets:missing", "error: model: 'fine_nets' has no attribute 'missing'"),
    ],
)
def test_a_plugin_that_does_not_import_is_refused_before_redis_and_workers_start(
    tmp_path: Path, plugin: str, expected: str
) -> None:
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    (plugins / "broken_nets.py").write_text('raise RuntimeError("no GPU driver in this module")\n')
    (plugins / "fine_nets.py").write_text(
        textwrap.dedent("""
        def build(input_shape, num_classes, options):
            raise AssertionError("never built at a refused submit")
        """)
    )
    config = write_config(tmp_path, SMALL + f'model = "{plugin}"\n')
    assert refused(tmp_path, str(config), "--plugin-path", str(plugins)) == expected
