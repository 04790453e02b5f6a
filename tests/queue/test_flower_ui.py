"""The Flower UI as a user sees it, in headless Chromium, while a run is going: workers, tasks, basic auth.

Flower's HTTP API is checked first, so a failure says whether Flower or the browser is at fault.
Set FEDQUEUE_SCREENSHOTS to a folder to keep the two screenshots (the README's come from here).
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
from pathlib import Path
from typing import Any

import psutil

from fedqueue.config import Settings
from fedqueue.fl import api
from tests.conftest import running_workers
from tests.support.cli_inputs import cli_env
from tests.support.reliability_support import reliable_settings, slow_config, wait_until
from tests.support.service_support import free_port, http_get, required_tool, running_flower

PASSWORD = "flower-test-pw-7Q2x"


def _wait_for_page(browser: Any, url: str, auth: tuple[str, str], needles: list[str], timeout_s: float = 60) -> str:
    """Open `url` until its text shows every needle (pages fill in, workers come online); its text."""
    deadline = time.monotonic() + timeout_s
    while True:
        assert browser.open(url, auth) == 200
        for _ in range(10):
            text = str(browser.text())
            if all(needle in text for needle in needles):
                return text
            time.sleep(0.3)
        if time.monotonic() > deadline:
            raise AssertionError(f"{url} never showed {needles}: {text[:1500]}")


def test_flower_shows_workers_and_device_tasks_behind_basic_auth(settings: Settings, tmp_path: Path) -> None:
    from tests.support.browser import Browser

    chromium = required_tool("chromium", "chromium", "the Flower UI")
    settings = reliable_settings(settings)
    auth = ("admin", PASSWORD)
    with running_workers(settings, procs=2, log_dir=tmp_path / "logs") as group:
        workers = {f"{spec.name}@{socket.gethostname()}" for spec in group.specs}
        env = {**cli_env(settings), "FLOWER_BASIC_AUTH": f"admin:{PASSWORD}"}
        with running_flower(env, free_port(), tmp_path / "flower.log") as base:
            handle = api.submit(slow_config(0.05, rounds=6, devices_per_round=8, num_devices=20), settings=settings)
            # Flower's API first: if these fail, Flower is at fault, not the browser.
            assert http_get(f"{base}/api/workers")[0] == 401
            for worker in workers:

                def listed(w: str = worker) -> bool:
                    return w in (http_get(f"{base}/api/workers?refresh=1&workername={w}", auth)[1] or {})

                wait_until(listed, 60)

            def device_tasks() -> list[dict[str, Any]]:
                tasks = http_get(f"{base}/api/tasks", auth)[1] or {}
                return [task for task in tasks.values() if f"run {handle.id} round" in str(task.get("args"))]

            wait_until(lambda: len(device_tasks()) >= 4, 60)
            assert all(" device " in str(task["args"]) or " pack " in str(task["args"]) for task in device_tasks())

            browser = Browser(chromium, tmp_path / "chromium")
            try:
                assert browser.open(f"{base}/workers") == 401
                assert browser.open(f"{base}/tasks") == 401
                shots = Path(os.environ.get("FEDQUEUE_SCREENSHOTS") or tmp_path)
                _wait_for_page(browser, f"{base}/workers", auth, sorted(workers))
                browser.screenshot(shots / "flower-workers.png")
                # The task list fills in from Flower's API after the page loads.
                text = _wait_for_page(browser, f"{base}/tasks", auth, [f"run {handle.id} round", " device "])
                assert "fedqueue.train_device" in text
                browser.screenshot(shots / "flower-tasks.png")
            finally:
                browser.close()
            assert (shots / "flower-workers.png").stat().st_size > 10_000
            # The password is on no process's command line: Flower's, the workers', the browser's.
            lines = []
            for process in psutil.process_iter():
                with contextlib.suppress(psutil.Error):
                    lines.append(" ".join(process.cmdline()))
            assert lines and not [line for line in lines if PASSWORD in line]
            assert handle.wait(timeout_s=180)["state"] == "finished"
