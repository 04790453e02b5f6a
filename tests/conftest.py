"""Real services for the tests: Redis (the local service, else an embedded one) and SQLite/Postgres.

Every test run uses its own Redis key prefix and its own Postgres database, and removes both at the end.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
import redis

import fedqueue.config
from fedqueue.config import Settings
from fedqueue.core.database import open_store
from fedqueue.queue.embedded import EmbeddedRedis
from fedqueue.queue.workers import WorkerGroup, named, plan_workers
from fedqueue.store import Store

SERVICE_REDIS = os.environ.get("FEDQUEUE_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
SERVICE_POSTGRES = os.environ.get("FEDQUEUE_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres")


@pytest.fixture(autouse=True, scope="session")
def one_torch_thread() -> None:
    """The test process trains small models beside the worker processes it starts: on one thread, as
    the workers' tasks train (threads_per_task), they run many times faster than on threads that
    contend for the same cores."""
    import torch

    torch.set_num_threads(1)


def _private_folders(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("cache")))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path_factory.mktemp("state")))
    blob_files = str(tmp_path_factory.mktemp("shm"))
    monkeypatch.setenv("FEDQUEUE_BLOB_SHM_DIR", blob_files)
    monkeypatch.setattr(fedqueue.config, "DEFAULT_BLOB_SHM_DIR", blob_files)  # Settings made in the test itself


@pytest.fixture(autouse=True, scope="session")
def private_session_folders(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Private cache, state and blob folders, as `private_cache` gives each test, for what module and session
    fixtures start: their Settings and workers are made before any test's own folders exist."""
    with pytest.MonkeyPatch.context() as monkeypatch:
        _private_folders(tmp_path_factory, monkeypatch)
        yield


@pytest.fixture(autouse=True)
def private_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test (and the commands it starts) remembers timed pack modes in its own cache, writes local
    clusters' logs in its own state folder, not the user's, and its blob files in a folder of its own instead
    of the host's shared memory, so none outlives it."""
    _private_folders(tmp_path_factory, monkeypatch)


def _redis_answers(url: str) -> bool:
    try:
        redis.Redis.from_url(url, socket_connect_timeout=1).ping()
        return True
    except redis.RedisError:
        return False


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    if _redis_answers(SERVICE_REDIS):
        yield SERVICE_REDIS
        return
    with EmbeddedRedis() as embedded:
        yield embedded.url


@pytest.fixture(scope="session")
def key_prefix(redis_url: str) -> Iterator[str]:
    prefix = f"fqtest-{uuid.uuid4().hex[:8]}"
    yield prefix
    client = redis.Redis.from_url(redis_url)
    keys = list(client.scan_iter(match=f"{prefix}*", count=1000))
    if keys:
        client.delete(*keys)


def _postgres_admin() -> object | None:
    from sqlalchemy import create_engine
    from sqlalchemy.exc import OperationalError

    engine = create_engine(SERVICE_POSTGRES, isolation_level="AUTOCOMMIT", connect_args={"connect_timeout": 3})
    try:
        with engine.connect():
            return engine
    except OperationalError:
        return None


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """A fresh Postgres database for this test run, dropped at the end."""
    from sqlalchemy import text

    admin = _postgres_admin()
    if admin is None:
        if os.environ.get("CI") == "true":  # CI has a Postgres: its absence is a failure, never a skip
            pytest.fail(f"CI=true and no Postgres answers at {SERVICE_POSTGRES}")
        pytest.skip(f"no Postgres answers at {SERVICE_POSTGRES}: Postgres store tests skipped")
    name = f"fedqueue_test_{uuid.uuid4().hex[:10]}"
    with admin.connect() as connection:  # type: ignore[attr-defined]
        connection.execute(text(f'CREATE DATABASE "{name}"'))
    from sqlalchemy.engine import make_url

    yield make_url(SERVICE_POSTGRES).set(database=name).render_as_string(hide_password=False)
    with admin.connect() as connection:  # type: ignore[attr-defined]
        connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()  # type: ignore[attr-defined]


@pytest.fixture(params=["sqlite", "postgres"])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """One store test, run once on SQLite and once on Postgres."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'store.db'}"
    return request.getfixturevalue("postgres_url")


@pytest.fixture
def store(database_url: str) -> Iterator[Store]:
    """A store on `database_url`, its schema brought up to date."""
    opened = open_store(database_url, migrate=True)
    yield opened
    opened.close()


@pytest.fixture
def settings(redis_url: str, key_prefix: str, tmp_path: Path) -> Settings:
    """Settings for one test: its own SQLite file, its own queue inside this run's key prefix, and its own
    folder for blob files (standing in for shared memory)."""
    return Settings(
        broker_url=redis_url,
        database_url=f"sqlite:///{tmp_path / 'fedqueue.db'}",
        key_prefix=f"{key_prefix}-{uuid.uuid4().hex[:6]}",
        task_time_limit_s=120,
        blob_shm_dir=str(tmp_path),  # blob files in the test's folder, gone with it
    )


@contextlib.contextmanager
def running_workers(
    settings: Settings, procs: int, slots: int = 1, log_dir: Path | None = None, name: str | None = None
) -> Iterator[WorkerGroup]:
    """`procs` worker processes, ready; `name` renames a single one (a second group beside a running one)."""
    group = WorkerGroup(settings, named(plan_workers([], procs, slots), name), log_dir=log_dir)
    group.start()
    try:
        group.wait_ready(timeout_s=120)
        yield group
    finally:
        group.stop(timeout_s=30)


def with_database(settings: Settings, url: str) -> Settings:
    return replace(settings, database_url=url)
