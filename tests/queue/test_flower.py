"""How fedqueue starts Flower: its arguments, and what it refuses to start without."""

from __future__ import annotations

import pytest

from fedqueue.config import Settings
from fedqueue.errors import ConfigError
from fedqueue.queue.flower import check_basic_auth, flower_command


def test_flower_starts_read_only_with_the_arguments_column_and_needs_basic_auth() -> None:
    settings = Settings(broker_url="redis://127.0.0.1:6379/0")
    command = flower_command(settings, "127.0.0.1", 5555, allow_actions=False)
    assert command[-4:] == [
        "--address=127.0.0.1",
        "--port=5555",
        "--tasks_columns=name,uuid,state,args,received,started,runtime,worker",
        "--read_only=True",
    ]
    assert "--read_only=True" not in flower_command(settings, "0.0.0.0", 80, allow_actions=True)
    with pytest.raises(ConfigError, match="FEDQUEUE_BROKER_URL: not set"):
        flower_command(Settings(), "127.0.0.1", 5555, allow_actions=False)
    check_basic_auth({"FLOWER_BASIC_AUTH": "admin:pw,viewer:other"})
    for value in ("", "admin", "admin:", ":pw", "admin:pw,viewer"):
        with pytest.raises(ConfigError, match="FLOWER_BASIC_AUTH"):
            check_basic_auth({"FLOWER_BASIC_AUTH": value})
