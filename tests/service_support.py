"""What the deployment and Flower tests share: outside tools they need, free ports, HTTP with basic auth."""

from __future__ import annotations

import base64
import json
import os
import shutil
import socket
import urllib.error
import urllib.request
from typing import Any

import pytest


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
