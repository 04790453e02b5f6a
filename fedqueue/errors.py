"""One exception hierarchy. The CLI maps each class to an exit code and one line."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class FedqueueError(Exception):
    """Base of every error fedqueue raises on purpose; `str(err)` is the user's line."""

    exit_code = 1


class ConfigError(FedqueueError):
    """A run config or setting is invalid; the message names the field at fault."""

    exit_code = 2


class DataError(FedqueueError):
    """A dataset cannot be loaded (missing root, unreadable files)."""

    exit_code = 2


class ServiceUnavailable(FedqueueError):
    """The broker or the database does not answer."""

    exit_code = 2


class NotFound(FedqueueError):
    """A run id (or another named record) does not exist."""

    exit_code = 2


class BlobIntegrityError(FedqueueError):
    """A stored blob is missing or its sha256 does not match its reference."""

    exit_code = 1


def did_you_mean(name: str, known: Iterable[str]) -> str:
    """The words an error adds for a name that is not known: the closest known one, where one is close."""
    close = difflib.get_close_matches(name, list(known), n=1)
    return f"; did you mean {close[0]!r}?" if close else ""
