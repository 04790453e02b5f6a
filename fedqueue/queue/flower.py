"""The Flower UI on fedqueue's broker: the command line it starts with, and the checks before it starts.

Flower reads FLOWER_* variables from its environment, so the password of basic auth stays
there and never appears in a process list or a shell history.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping

from fedqueue.config import Settings
from fedqueue.errors import ConfigError

# The task list with the arguments column: a device task's args name its run, round and devices.
TASK_COLUMNS = "name,uuid,state,args,received,started,runtime,worker"
AUTH_VARIABLE = "FLOWER_BASIC_AUTH"


def check_basic_auth(env: Mapping[str, str]) -> None:
    """Refuse to start Flower without basic auth (user:password, comma-separated for several users)."""
    value = env.get(AUTH_VARIABLE, "")
    if not value:
        raise ConfigError(f"{AUTH_VARIABLE}: not set; export user:password (kept out of command lines)")
    for pair in value.split(","):
        user, colon, password = pair.partition(":")
        if not (user and colon and password):
            raise ConfigError(f"{AUTH_VARIABLE}: expected user:password[,user:password...], got a pair without both")


def flower_env(settings: Settings, env: Mapping[str, str]) -> dict[str, str]:
    """The environment Flower starts with: this one, with the broker that was found (`fedqueue up`'s cluster
    where none is configured), since the app Flower loads reads its broker from there."""
    return {**env, "FEDQUEUE_BROKER_URL": settings.broker_url or ""}


def flower_command(settings: Settings, address: str, port: int, allow_actions: bool) -> list[str]:
    """`celery flower` for fedqueue's app and broker; read-only unless actions are allowed.

    Actions are off by default: the threads pool that workers run cannot grow, shrink or
    autoscale (those buttons fail), and shutdown or rate limits are for an operator, not for
    everyone who may look at the UI.
    """
    if not settings.broker_url:
        raise ConfigError(
            "FEDQUEUE_BROKER_URL: not set and no local cluster is up (fedqueue up -d starts one); Flower watches the"
            " broker the workers use"
        )
    if not 0 < port < 65536:
        raise ConfigError(f"--port: must be 1-65535, got {port}")
    command = [
        sys.executable,
        "-m",
        "celery",
        "--app",
        "fedqueue.queue.worker_app:app",
        "flower",
        f"--address={address}",
        f"--port={port}",
        f"--tasks_columns={TASK_COLUMNS}",
    ]
    if not allow_actions:
        command.append("--read_only=True")
    return command
