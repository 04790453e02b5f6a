"""Settings from the environment: secrets, defaults, refusals."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from fedqueue.config import Settings, insecure_broker, mask_url
from fedqueue.errors import ConfigError


def test_redis_password_comes_from_its_own_variable_and_is_never_shown() -> None:
    settings = Settings.from_env({"FEDQUEUE_BROKER_URL": "redis://redis:6379/0", "FEDQUEUE_REDIS_PASSWORD": "p@ss/w"})
    assert settings.broker_url == "redis://:p%40ss%2Fw@redis:6379/0"
    assert "p%40ss" not in mask_url(settings.broker_url) and "***" in mask_url(settings.broker_url)
    # A password already in the URL wins.
    kept = Settings.from_env({"FEDQUEUE_BROKER_URL": "redis://:inurl@h:1/0", "FEDQUEUE_REDIS_PASSWORD": "env"})
    assert kept.broker_url == "redis://:inurl@h:1/0"


@pytest.mark.parametrize(
    ("url", "insecure"),
    [
        ("redis://127.0.0.1:6379/0", False),
        ("redis://localhost:6379/0", False),
        ("redis://redis:6379/0", True),
        ("redis://:secret@redis:6379/0", False),
        ("rediss://10.0.0.5:6380/0", True),
        (None, False),
    ],
)
def test_a_redis_beyond_loopback_without_password_is_flagged(url: str | None, insecure: bool) -> None:
    assert insecure_broker(url) is insecure


def test_settings_round_trip_through_the_environment(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    settings = Settings(
        broker_url="redis://h:1/0",
        key_prefix="p",
        heartbeat_ttl_s=4,
        plugin_path=(str(tmp_path / "a"), str(tmp_path / "b")),
        visibility_timeout_override_s=9,
        blob_dir=str(tmp_path / "blobs"),
    )
    assert Settings.from_env(settings.to_env()) == settings
    assert Settings().visibility_timeout_s > Settings().task_time_limit_s  # never redelivered while running


@pytest.mark.parametrize(
    ("variable", "value"),
    [("FEDQUEUE_MAX_ATTEMPTS", "0"), ("FEDQUEUE_THREADS_PER_TASK", "two"), ("FEDQUEUE_KEY_PREFIX", "a b")],
)
def test_bad_settings_name_the_variable(variable: str, value: str) -> None:
    with pytest.raises(ConfigError, match=variable):
        Settings.from_env({variable: value})


def test_a_plugin_folder_that_does_not_exist_is_refused_naming_the_variable(tmp_path: Path) -> None:
    missing = str(tmp_path / "nowhere")
    with pytest.raises(ConfigError) as refused:
        Settings.from_env({"FEDQUEUE_PLUGIN_PATH": os.pathsep.join([str(tmp_path), missing])})
    assert str(refused.value) == f"FEDQUEUE_PLUGIN_PATH: folder {missing!r} does not exist"
    assert Settings.from_env({"FEDQUEUE_PLUGIN_PATH": str(tmp_path)}).plugin_path == (str(tmp_path),)


def test_a_blob_folder_is_refused_where_it_could_not_be_made_and_nothing_is_made(tmp_path: Path) -> None:
    deep = tmp_path / "nowhere" / "blobs"
    with pytest.raises(ConfigError) as refused:
        Settings.from_env({"FEDQUEUE_BLOB_DIR": str(deep)})
    assert str(refused.value) == (
        f"FEDQUEUE_BLOB_DIR: folder {str(deep)!r} does not exist, nor does the folder {str(deep.parent)!r} to make"
        " it in"
    )
    assert not deep.parent.exists()
    (tmp_path / "file").write_text("")
    with pytest.raises(ConfigError, match="^FEDQUEUE_BLOB_DIR: .* is a file, not a folder$"):
        Settings.from_env({"FEDQUEUE_BLOB_DIR": str(tmp_path / "file")})
    # A folder that exists, or one to make in a folder that does, is taken as it is.
    assert Settings.from_env({"FEDQUEUE_BLOB_DIR": str(tmp_path)}).blob_dir == str(tmp_path)
    assert Settings.from_env({"FEDQUEUE_BLOB_DIR": str(tmp_path / "blobs")}).blob_dir == str(tmp_path / "blobs")


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        (
            "sqlite://fedqueue.db",
            "sqlite://fedqueue.db makes 'fedqueue.db' a host name; a SQLite file takes three slashes:"
            " sqlite:///fedqueue.db (four for an absolute path: sqlite:////path/to/fedqueue.db)",
        ),
        ("postgres://u@h/db", "postgres:// is not understood: write postgresql://"),
        ("mysql://u@h/db", "unsupported database 'mysql' (use sqlite:///PATH or postgresql://USER@HOST/DB)"),
        ("fedqueue.db", "not a database URL (expected sqlite:///PATH or postgresql://USER@HOST/DB)"),
    ],
)
def test_a_store_url_written_wrong_is_refused_when_read_with_its_fix(url: str, expected: str) -> None:
    with pytest.raises(ConfigError) as refused:
        Settings.from_env({"FEDQUEUE_DATABASE_URL": url})
    assert str(refused.value) == f"FEDQUEUE_DATABASE_URL: {expected}"


@pytest.mark.parametrize(
    "url", ["sqlite:///fedqueue.db", "sqlite:////tmp/x.db", "sqlite+pysqlite:///x.db", "postgresql://u@h:5432/db"]
)
def test_store_urls_written_right_are_taken(url: str) -> None:
    assert Settings.from_env({"FEDQUEUE_DATABASE_URL": url}).database_url == url


@pytest.mark.parametrize("url", ["sqlite://", "sqlite:///:memory:", "sqlite:///file:x?mode=memory&uri=true"])
def test_an_in_memory_sqlite_is_read_but_refused_for_work_that_outlives_the_command(url: str) -> None:
    settings = Settings.from_env({"FEDQUEUE_DATABASE_URL": url})  # `status` or `runs` may read it: empty
    with pytest.raises(ConfigError, match="^FEDQUEUE_DATABASE_URL: .* is an in-memory SQLite database"):
        settings.check_lasting_store()


def test_a_sqlite_file_in_a_folder_that_does_not_exist_is_refused_for_work(tmp_path: Path) -> None:
    settings = Settings(database_url=f"sqlite:///{tmp_path}/nonexistent/fedqueue.db")
    with pytest.raises(ConfigError, match="folder .*nonexistent' of the SQLite file does not exist"):
        settings.check_lasting_store()
    Settings(database_url=f"sqlite:///{tmp_path}/fedqueue.db").check_lasting_store()
