"""The `fedqueue` command line: FL commands at the top level, each job kind's own under its name."""

from fedqueue.cli.commands import app, main

__all__ = ["app", "main"]
