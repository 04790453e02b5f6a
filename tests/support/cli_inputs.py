"""What a test hands the `fedqueue` command: an environment clean of the caller's settings, and a config file."""

from __future__ import annotations

import os
from pathlib import Path

import fedqueue.config
from fedqueue.config import Settings

SMALL = "num_devices = 20\ndevices_per_round = 8\nrounds = 2\nlocal_iters = 5\nseed = 3\n"


def cli_env(settings: Settings | None = None, /, **extra: str) -> dict[str, str]:
    """This process's environment without its FEDQUEUE_ variables (a developer's own must not leak into a test),
    the test's blob folder, then the settings' variables, then `extra`."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("FEDQUEUE_")}
    # Blob files in the test's own folder (conftest's private_cache), where Settings made in the test put them too.
    env["FEDQUEUE_BLOB_SHM_DIR"] = fedqueue.config.DEFAULT_BLOB_SHM_DIR
    if settings is not None:
        env.update(settings.to_env())
    env.update(extra)
    return env


def write_config(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "run.toml"
    path.write_text(text)
    return path
