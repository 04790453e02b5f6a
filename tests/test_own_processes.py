"""The tests' own-process check: it finds what a test's command left behind, and nothing else on the machine."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from tests.own_processes import ProcessMark
from tests.reliability_support import wait_until

SLEEPER = [sys.executable, "-c", "import time; time.sleep(600)"]


def test_a_mark_finds_a_left_behind_grandchild_in_its_own_session_and_nothing_unmarked() -> None:
    mark = ProcessMark()
    # A command that starts a child in a session of its own and exits without stopping it, as a launcher
    # killed with its worker still running: the child is adopted by init, outside the command's group.
    leaves_one = (
        "import subprocess, sys; "
        f"child = subprocess.Popen({SLEEPER!r}, start_new_session=True, "
        "stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL); "
        "print(child.pid)"
    )
    command = subprocess.run(
        [sys.executable, "-c", leaves_one], env=mark.env(), capture_output=True, text=True, timeout=60
    )
    left = int(command.stdout)
    unmarked = subprocess.Popen(SLEEPER)  # another test's or user's process, alive at the same time
    try:
        assert mark.alive() == {left}
        assert ProcessMark().alive() == set()
    finally:
        os.kill(left, signal.SIGKILL)
        unmarked.kill()
        unmarked.wait()
    wait_until(lambda: mark.alive() == set(), 30)
