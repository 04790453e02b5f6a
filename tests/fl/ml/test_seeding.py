from __future__ import annotations

import itertools
import os
import subprocess
import sys
from pathlib import Path

from fedqueue.fl.ml.seeding import task_seed

REPO_ROOT = Path(__file__).resolve().parents[3]


def test_same_inputs_same_seed_and_63_bits() -> None:
    seed = task_seed(11, 3, 7)
    assert seed == task_seed(11, 3, 7)
    assert 0 <= seed < 2**63


def test_every_input_changes_the_seed() -> None:
    grid = list(itertools.product(range(3), range(5), range(7)))
    seeds = {task_seed(*args) for args in grid}
    assert len(seeds) == len(grid)
    assert task_seed(1, 2, 3) != task_seed(3, 2, 1)


def test_seed_is_the_same_in_another_process() -> None:
    code = "from fedqueue.fl.ml.seeding import task_seed; print(task_seed(11, 3, 7))"
    env = {**os.environ, "PYTHONHASHSEED": "12345", "PYTHONPATH": str(REPO_ROOT)}
    out = subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    assert int(out.stdout.strip()) == task_seed(11, 3, 7)
