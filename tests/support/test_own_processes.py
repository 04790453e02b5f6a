"""The tests' own-process check: it finds what a test's command left behind, and nothing else on the machine."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from tests.support.own_processes import ProcessMark
from tests.support.reliability_support import wait_until

SLEEPER = [sys.executable, "-c", "import time; time.sleep(600)"]

# A command that starts two children in sessions of their own and exits without stopping them, as a launcher
# killed with its workers still running: init adopts them, outside the command's process group. The second
# lost its environment, as Redis's is overwritten by its process title, and works in a temporary folder.
LEAVES_TWO = f"""
import subprocess, tempfile
quiet = dict(start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
print(subprocess.Popen({SLEEPER!r}, **quiet).pid)
print(subprocess.Popen({SLEEPER!r}, env={{}}, cwd=tempfile.mkdtemp(), **quiet).pid)
"""


def test_a_mark_finds_what_a_command_left_behind_and_nothing_unmarked(tmp_path: Path) -> None:
    mark = ProcessMark(tmp_path / "one")
    command = subprocess.run(
        [sys.executable, "-c", LEAVES_TWO], env=mark.env(), capture_output=True, text=True, timeout=60
    )
    left = {int(pid) for pid in command.stdout.split()}
    unmarked = subprocess.Popen(SLEEPER, cwd=tmp_path)  # another test's or user's process, alive meanwhile
    try:
        assert len(left) == 2 and mark.alive() == left
        assert ProcessMark(tmp_path / "other").alive() == set()
    finally:
        for pid in left:
            os.kill(pid, signal.SIGKILL)
        unmarked.kill()
        unmarked.wait()
    wait_until(lambda: mark.alive() == set(), 30)
