"""A folder that files are to be written into, made and tried before anything else is done."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from fedqueue.errors import ConfigError


def writable_folder(path: str | os.PathLike[str], name: str) -> Path:
    """Make the folder (and its parents) and prove a file can be written in it; ConfigError naming `name` if not."""
    folder = Path(path).expanduser()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except FileExistsError:
        raise ConfigError(f"{name}: {str(folder)!r} is a file, not a folder") from None
    except OSError as err:
        raise ConfigError(f"{name}: cannot write to {str(folder)!r} ({err.strerror or type(err).__name__})") from None
    return folder
