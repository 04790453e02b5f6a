"""A worker launcher outlives its store: while the database refuses connections, adopting runs waits, never raises.

Real parts: a Postgres database of this test's own (closed to connections, then opened again), real Redis, and
the launcher's own RunAdopter over them, as `fedqueue worker` ticks it between its workers' checks.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.engine import make_url

from fedqueue.config import Settings
from fedqueue.core.connect import open_services
from fedqueue.core.runs.adopt import RunAdopter
from fedqueue.fl.scheduler import submit_run
from tests.conftest import SERVICE_POSTGRES, _postgres_admin
from tests.support.helpers import small_config

pytestmark = pytest.mark.faults


@pytest.fixture
def own_database() -> Iterator[tuple[Engine, str]]:
    """A Postgres database for this test alone (it is closed to connections mid-test), dropped at the end."""
    admin = _postgres_admin()
    if admin is None:
        pytest.skip(f"no Postgres answers at {SERVICE_POSTGRES}")  # conftest's postgres_url fails it under CI
    assert isinstance(admin, Engine)
    name = f"fedqueue_outage_{uuid.uuid4().hex[:10]}"
    with admin.connect() as connection:
        connection.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield admin, make_url(SERVICE_POSTGRES).set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as connection:
            connection.execute(text(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true'))
            connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def _close_database(admin: Engine, url: str) -> None:
    """Refuse new connections and end the open ones: the store is down as a stopped server is."""
    name = make_url(url).database
    with admin.connect() as connection:
        connection.execute(text(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false'))
        connection.execute(
            text(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = :name AND pid <> pg_backend_pid()"
            ),
            {"name": name},
        )


def _open_database(admin: Engine, url: str) -> None:
    with admin.connect() as connection:
        connection.execute(text(f'ALTER DATABASE "{make_url(url).database}" ALLOW_CONNECTIONS true'))


def _ticks_until(adopter: RunAdopter, wanted: str, timeout_s: float) -> list[str]:
    """Every line the adopter gives until one contains `wanted` (ticking as the launcher does)."""
    lines: list[str] = []
    deadline = time.monotonic() + timeout_s
    while not any(wanted in line for line in lines):
        assert time.monotonic() < deadline, f"no line with {wanted!r} within {timeout_s} s: {lines}"
        lines += adopter.tick()
        time.sleep(0.05)
    return lines


def test_a_launcher_keeps_adopting_after_its_store_refused_connections(
    settings: Settings, own_database: tuple[Engine, str]
) -> None:
    admin, url = own_database
    # A short lease: a run nobody follows is adoptable a second after it was created.
    settings = replace(settings, database_url=url, lease_ttl_s=2)
    sent: list[Any] = []
    services = open_services(settings, sent.extend, migrate=True)
    adopter = RunAdopter(services)
    try:
        _close_database(admin, url)
        lines = _ticks_until(adopter, "store unavailable", timeout_s=30)
        assert len([line for line in lines if "unavailable" in line]) == 1
        assert "the workers keep their tasks" in lines[-1]
        # Down for longer: further looks back off and say nothing more, and never raise.
        for _ in range(20):
            assert adopter.tick() == []
        _open_database(admin, url)
        run_id = submit_run(services, small_config(devices_per_round=2, rounds=1))
        lines = _ticks_until(adopter, f"run {run_id}: nobody was following it; adopted", timeout_s=60)
        assert lines[0] == "store and broker reachable again: adopting and repairing runs"
        assert (services.store.get_run(run_id).lease_owner or "").startswith("worker launcher")
    finally:
        adopter.release_all()
        services.close()
