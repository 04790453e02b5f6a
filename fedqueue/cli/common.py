"""What every `fedqueue` command shares: consoles, error handling, common options and warnings."""

from __future__ import annotations

import functools
import logging
import os
import sys
from collections.abc import Callable
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console
from rich.markup import escape

from fedqueue.config import Settings, insecure_broker, mask_url
from fedqueue.core.infra_errors import infrastructure_fault
from fedqueue.errors import FedqueueError

# Piped output is not cut at 80 columns (tables and summaries stay one line per row) unless COLUMNS says so.
console = Console(width=None if sys.stdout.isatty() or os.environ.get("COLUMNS") else 160)
error_console = Console(stderr=True, soft_wrap=True)
F = TypeVar("F", bound=Callable[..., Any])

ProcsOpt = Annotated[int | None, typer.Option(help="Worker processes on a host without GPUs (default: one per core).")]
SlotsOpt = Annotated[int, typer.Option(help="Concurrent tasks per worker process.")]
GpusPerWorkerOpt = Annotated[
    int, typer.Option(help="GPUs per worker process, for models larger than one GPU (spread with device_map=auto).")
]
ProcsPerGpuOpt = Annotated[
    int, typer.Option(help="Worker processes per GPU, each with its own CUDA context (small models).")
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON for scripts.")]
AllRowsOpt = Annotated[
    bool,
    typer.Option("--all", help="Print every row of the run's table (a long one shows its first and last rows)."),
]


log = logging.getLogger(__name__)


def warn_if_insecure(settings: Settings) -> None:
    if insecure_broker(settings.broker_url):
        error_console.print(
            f"warning: broker {escape(mask_url(settings.broker_url))} is reached beyond loopback without a password; "
            "set one (requirepass) and FEDQUEUE_REDIS_PASSWORD",
            highlight=False,
        )


def friendly_errors(command: F) -> F:
    """Turn fedqueue's own errors into one red line and their exit code; never a traceback."""

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return command(*args, **kwargs)
        except FedqueueError as err:
            error_console.print(f"[red]error:[/red] {escape(str(err))}", highlight=False)
            raise typer.Exit(err.exit_code) from None
        except Exception as err:
            # The broker failed under a command that does not wait for it (a submit caught mid-way): one line.
            fault = infrastructure_fault(err)
            if fault is None:
                raise
            error_console.print(
                f"[red]error:[/red] {escape(fault)} ({escape(str(err))}); nothing stored is lost: a run already"
                " stored is carried on by the workers (`fedqueue runs` lists it), else submit again",
                highlight=False,
            )
            raise typer.Exit(1) from None

    return wrapper  # type: ignore[return-value]


PluginPathOpt = Annotated[
    list[str] | None, typer.Option("--plugin-path", help="Folder to import plugins from (repeatable).")
]


def warn_if_no_workers(settings: Settings) -> None:
    # Celery: loaded by the commands that ask the workers, not by every command.
    from fedqueue.queue.app import make_app

    celery_app = make_app(settings)
    try:
        # limit=1: the first answer is enough, instead of collecting answers for the whole second.
        with celery_app.connection_for_write() as connection:  # its own: a refused ping breaks no pooled one
            answers = celery_app.control.ping(timeout=1.0, limit=1, connection=connection)
    except Exception as err:  # noqa: BLE001 - a broker that cannot take the ping (full, gone): nothing to warn of
        log.info("workers not asked (%s)", err)
        return
    finally:
        celery_app.close()
    if not answers:
        error_console.print("warning: no worker answers on this broker yet; its tasks wait for one (fedqueue worker)")
