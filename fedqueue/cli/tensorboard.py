"""`fedqueue report RUN --tensorboard DIR`: a run's scalars as TensorBoard event files, by its job kind."""

from __future__ import annotations

import shlex
from pathlib import Path

from rich.text import Text

from fedqueue.cli.common import console
from fedqueue.core import jobs
from fedqueue.store import Store


def write_tensorboard(store: Store, run_id: str, root: Path) -> None:
    """Write what the run's kind has of it as scalars under root/RUN_ID, and say where and how many."""
    run = store.get_run(run_id)  # an unknown id: NotFound, before any folder is made
    folder, written = jobs.get(run.kind).tensorboard(store, run_id, root)
    console.print(Text(f"{written} scalars written · {tensorboard_line(folder, folder.parent)}"), soft_wrap=True)


def tensorboard_line(folder: Path, root: Path) -> str:
    """Where a run's event files are, and the command that shows them: the whole folder, its runs side by side."""
    return f"TensorBoard files in {folder} · to see them: tensorboard --logdir {shlex.quote(str(root))}"
