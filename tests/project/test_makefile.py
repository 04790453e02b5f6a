"""`make install` (the first part of `make demo`) says each step as it starts, with how long it usually takes."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(shutil.which("make") is None, reason="no make on this machine")
def test_install_says_each_step_and_its_usual_time(tmp_path: Path) -> None:
    # A venv whose python and pip only record what they are asked: the steps run in an instant.
    bin_dir = tmp_path / "venv" / "bin"
    bin_dir.mkdir(parents=True)
    for tool in ("python", "pip"):
        (bin_dir / tool).write_text(f'#!/bin/sh\necho "{tool} $*" >> "{tmp_path / "asked"}"\n')
        (bin_dir / tool).chmod(0o755)
    result = subprocess.run(
        ["make", "--no-print-directory", "-C", str(REPO), "install", f"VENV={tmp_path / 'venv'}"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.splitlines() == [
        f"install 1/4: a Python 3.11 venv in {tmp_path / 'venv'} (about 5 s)",
        "install 2/4: the latest pip (about 10 s)",
        "install 3/4: torch and torchvision (about 1.5 minutes)",
        "install 4/4: fedqueue and its other dependencies (about 1 minute)",
        f"installed: the fedqueue command is {bin_dir / 'fedqueue'}",
    ]
    assert (tmp_path / "asked").read_text().splitlines() == [
        "pip install --quiet --upgrade pip",
        "pip install --quiet torch==2.14.1 torchvision==0.29.1",
        "pip install --quiet -e .[test]",
    ]
