"""A second worker host: a network namespace with its own hostname, reaching the first host's Redis and Postgres.

The test makes the host (`ip netns`, a veth pair, `unshare --uts`) and removes it. Redis
(with a password) listens on the first host's veth address; Postgres, which listens on
loopback here, is reached through a relay on that address. A run's tasks spread over
both hosts, each worker named after its host, in the store and in Flower, and the run
ends on the weights one host computes.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import threading
import uuid
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
import redis

from fedqueue.config import Settings
from fedqueue.fl import api
from fedqueue.fl.store.results import device_tasks
from tests.support.cli_inputs import cli_env
from tests.support.cli_runner import FEDQUEUE_CLI
from tests.support.helpers import assert_same_weights, reference_final_state
from tests.support.reliability_support import ping_count, reliable_settings, slow_config, wait_until
from tests.support.service_support import free_port, http_get, redis_answers, running_flower

PASSWORD = "second-host-redis-pw"


def _run(*command: str) -> None:
    subprocess.run(command, check=True, capture_output=True, text=True, timeout=30)


@contextlib.contextmanager
def second_host() -> Iterator[tuple[str, str, str]]:
    """A network namespace joined to this host by a veth pair: (namespace, this host's address, its address)."""
    if os.geteuid() != 0 or shutil.which("ip") is None or shutil.which("unshare") is None:
        pytest.skip("a second host needs root, `ip` (iproute2) and `unshare`: not available here")
    tag = uuid.uuid4().hex[:6]
    namespace, here, there = f"fq2-{tag}", f"fqa{tag}", f"fqb{tag}"
    subnet = 16 + int(tag[:2], 16) % 200  # 10.231.x.0/24, random per run: parallel runs do not collide
    first, second = f"10.231.{subnet}.1", f"10.231.{subnet}.2"
    try:
        _run("ip", "netns", "add", namespace)
    except subprocess.CalledProcessError as err:
        pytest.skip(f"cannot create a network namespace here: {err.stderr.strip()}")
    try:
        _run("ip", "link", "add", here, "type", "veth", "peer", "name", there)
        _run("ip", "link", "set", there, "netns", namespace)
        _run("ip", "addr", "add", f"{first}/24", "dev", here)
        _run("ip", "link", "set", here, "up")
        _run("ip", "netns", "exec", namespace, "ip", "addr", "add", f"{second}/24", "dev", there)
        _run("ip", "netns", "exec", namespace, "ip", "link", "set", there, "up")
        _run("ip", "netns", "exec", namespace, "ip", "link", "set", "lo", "up")
        yield namespace, first, second
    finally:
        # Removing the namespace removes its end of the pair, and with it this end.
        subprocess.run(["ip", "link", "del", here], capture_output=True)
        subprocess.run(["ip", "netns", "del", namespace], capture_output=True)


@contextlib.contextmanager
def redis_with_password(folder: Path, addresses: list[str]) -> Iterator[int]:
    """A Redis of this test's own, requiring a password, listening on the given addresses."""
    port = free_port()
    config = folder / "redis.conf"
    config.write_text(f'requirepass {PASSWORD}\nbind {" ".join(addresses)}\nport {port}\ndir {folder}\nsave ""\n')
    process = subprocess.Popen(["redis-server", str(config)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        client = redis.Redis(port=port, password=PASSWORD)
        wait_until(lambda: redis_answers(client), 30)
        yield port
    finally:
        process.terminate()
        process.wait(timeout=30)


@contextlib.contextmanager
def relay(listen: str, target_port: int) -> Iterator[int]:
    """Forward TCP from `listen` (a free port) to 127.0.0.1:target_port, as long as the block runs."""
    server = socket.create_server((listen, 0))
    server.settimeout(0.2)
    stop = threading.Event()

    def pipe(source: socket.socket, sink: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while chunk := source.recv(65536):
                sink.sendall(chunk)
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_WR)

    def accept() -> None:
        while not stop.is_set():
            try:
                client, _ = server.accept()
            except TimeoutError:
                continue
            upstream = socket.create_connection(("127.0.0.1", target_port))
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=pipe, args=(source, sink), daemon=True).start()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield int(server.getsockname()[1])
    finally:
        stop.set()
        thread.join()
        server.close()


@contextlib.contextmanager
def worker_host(command: list[str], env: dict[str, str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    with log.open("wb") as out:
        process = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        yield process
    finally:
        process.terminate()  # the launcher's warm stop: its workers finish and exit
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@pytest.mark.slow
def test_a_second_host_shares_the_run_and_the_weights_match_one_host(
    settings: Settings, postgres_url: str, tmp_path: Path
) -> None:
    from sqlalchemy.engine import make_url

    database = make_url(postgres_url)
    with (
        second_host() as (namespace, first, second),
        redis_with_password(tmp_path, ["127.0.0.1", first]) as redis_port,
        relay(first, database.port or 5432) as db_port,
    ):
        here = replace(
            reliable_settings(settings),
            broker_url=f"redis://127.0.0.1:{redis_port}/0",
            database_url=postgres_url,
        )
        # The second host knows the first only by its veth address, and the Redis password.
        there_env = {
            **cli_env(here),
            "FEDQUEUE_BROKER_URL": f"redis://{first}:{redis_port}/0",
            "FEDQUEUE_REDIS_PASSWORD": PASSWORD,
            "FEDQUEUE_DATABASE_URL": database.set(host=first, port=db_port).render_as_string(hide_password=False),
        }
        here_env = {**cli_env(here), "FEDQUEUE_REDIS_PASSWORD": PASSWORD}
        here = replace(here, broker_url=f"redis://:{PASSWORD}@127.0.0.1:{redis_port}/0")
        worker = [*FEDQUEUE_CLI, "worker", "--procs", "1"]
        in_namespace = [
            "ip",
            "netns",
            "exec",
            namespace,
            "unshare",
            "--uts",
            "sh",
            "-c",
            'hostname host2 && exec "$@"',
            "-",
        ]
        with (
            worker_host(worker, here_env, tmp_path / "host1.log"),
            worker_host([*in_namespace, *worker], there_env, tmp_path / "host2.log") as remote,
        ):
            wait_until(lambda: ping_count(here) >= 2 or remote.poll() is not None, 120)
            assert remote.poll() is None, (tmp_path / "host2.log").read_text()[-3000:]
            config = slow_config(0.05, rounds=3, devices_per_round=8, num_devices=20)
            handle = api.submit(config, settings=here)
            assert handle.wait(timeout_s=240)["state"] == "finished"
            workers = {row.worker for row in device_tasks(handle.store, handle.id)}
            hosts = {worker.split("@")[1] for worker in workers}
            assert "host2" in hosts and len(hosts) == 2, workers
            assert_same_weights(handle.final_weights(), reference_final_state(config))
            # Flower, on the first host, lists the workers of both.
            flower_env = {**here_env, "FLOWER_BASIC_AUTH": "admin:pw"}
            with running_flower(flower_env, free_port(), tmp_path / "flower.log") as base:

                def listed() -> bool:
                    status, found = http_get(f"{base}/api/workers?refresh=1", ("admin", "pw"))
                    return status == 200 and workers <= set(found)

                wait_until(listed, 60)
