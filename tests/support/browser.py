"""Headless Chromium driven over the DevTools protocol: open a page (with basic auth in a header), read it, shoot it.

The credentials go to the browser over its debugging socket, so they never appear on a
command line, as a URL with user:password would.
"""

from __future__ import annotations

import base64
import itertools
import json
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

import websocket

FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-quic",
    "--no-first-run",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1500,900",
    "--remote-debugging-port=0",
)


class Browser:
    def __init__(self, chromium: str, profile: Path, timeout_s: float = 60.0) -> None:
        self.timeout_s = timeout_s
        self.process = subprocess.Popen(
            [chromium, *FLAGS, f"--user-data-dir={profile}", "about:blank"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        port_file = profile / "DevToolsActivePort"
        deadline = time.monotonic() + timeout_s
        while not (port_file.exists() and port_file.read_text().strip()):
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("Chromium did not open its debugging port")
            time.sleep(0.1)
        port = int(port_file.read_text().split()[0])
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as answer:
            pages = [target for target in json.load(answer) if target["type"] == "page"]
        self._socket = websocket.create_connection(pages[0]["webSocketDebuggerUrl"], timeout=timeout_s)
        self._ids = itertools.count(1)
        self._events: list[dict[str, Any]] = []
        self.call("Page.enable")
        self.call("Network.enable")

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        number = next(self._ids)
        self._socket.send(json.dumps({"id": number, "method": method, "params": params}))
        while True:
            message = json.loads(self._socket.recv())
            if message.get("id") == number:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return dict(message.get("result", {}))
            self._events.append(message)

    def _wait_event(self, method: str) -> dict[str, Any]:
        deadline = time.monotonic() + self.timeout_s
        while time.monotonic() < deadline:
            for position, event in enumerate(self._events):
                if event.get("method") == method:
                    return dict(self._events.pop(position))
            self._events.append(json.loads(self._socket.recv()))
        raise TimeoutError(f"no {method} within {self.timeout_s} s")

    def open(self, url: str, auth: tuple[str, str] | None = None) -> int:
        """Load `url` (sending basic auth if given) and return the HTTP status of the page itself."""
        headers = (
            {} if auth is None else {"Authorization": "Basic " + base64.b64encode(":".join(auth).encode()).decode()}
        )
        self.call("Network.setExtraHTTPHeaders", headers=headers)
        self._events.clear()
        frame = self.call("Page.navigate", url=url)
        self._wait_event("Page.loadEventFired")
        for event in self._events:
            params = event.get("params", {})
            if (
                event.get("method") == "Network.responseReceived"
                and params.get("loaderId") == frame.get("loaderId")
                and params.get("type") == "Document"
            ):
                return int(params["response"]["status"])
        raise RuntimeError(f"no response seen for {url}")

    def text(self) -> str:
        result = self.call("Runtime.evaluate", expression="document.body ? document.body.innerText : ''")
        return str(result["result"].get("value", ""))

    def screenshot(self, path: Path) -> None:
        shot = self.call("Page.captureScreenshot", format="png")
        path.write_bytes(base64.b64decode(shot["data"]))

    def close(self) -> None:
        try:
            self._socket.close()
        finally:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
