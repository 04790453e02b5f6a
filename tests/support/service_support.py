"""What the deployment and Flower tests share: outside tools they need, free ports, HTTP with basic auth."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import socket
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from tests.support.cli_runner import start_fedqueue_cli
from tests.support.reliability_support import wait_until


def required_tool(name: str, package: str, needed_for: str) -> str:
    """The path of a command the test needs: missing, it fails under CI and skips elsewhere."""
    found = shutil.which(name)
    if found is None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true and no {name} (Debian's {package} package): {needed_for} is not tested")
        pytest.skip(f"{name} is not installed: {needed_for} is not tested")
    return found


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def http_get(url: str, auth: tuple[str, str] | None = None) -> tuple[int, Any]:
    """A GET: its status (0 when nothing answers) and its body, parsed when it is JSON."""
    request = urllib.request.Request(url)
    if auth is not None:
        request.add_header("Authorization", "Basic " + base64.b64encode(":".join(auth).encode()).decode())
    try:
        with urllib.request.urlopen(request, timeout=5) as answer:
            body = answer.read()
            return answer.status, json.loads(body) if "json" in answer.headers.get("Content-Type", "") else body
    except urllib.error.HTTPError as err:
        return err.code, None
    except OSError:
        return 0, None


def redis_answers(client: redis.Redis) -> bool:
    with contextlib.suppress(redis.RedisError):
        return bool(client.ping())
    return False


@contextlib.contextmanager
def running_flower(env: dict[str, str], port: int, log: Path) -> Iterator[str]:
    """`fedqueue monitor` as the README starts it (the password only in `env`); yields its base URL."""
    with log.open("wb") as out:
        process = start_fedqueue_cli("monitor", "--port", str(port), env=env, stdout=out, stderr=out)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: http_get(f"{base}/healthcheck")[0] == 200 or process.poll() is not None, 60)
        assert process.poll() is None, log.read_text()[-2000:]
        yield base
    finally:
        process.terminate()
        process.wait(timeout=30)
