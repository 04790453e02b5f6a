"""`fedqueue status` with no run: the messages workers refused for good (fedqueue.core.broker.dead_letters)."""

from __future__ import annotations

import dataclasses
import json
import time

from rich.markup import escape

from fedqueue.cli.common import console
from fedqueue.config import Settings
from fedqueue.core.broker.dead_letters import recent_dead_letters
from fedqueue.core.services import connect_redis
from fedqueue.errors import ConfigError

SHOWN = 5  # the latest dead letters listed


def show_dead_letters(settings: Settings, as_json: bool) -> None:
    if not settings.broker_url:
        raise ConfigError("status: no broker to read dead letters from (set FEDQUEUE_BROKER_URL, or `fedqueue up`)")
    client = connect_redis(settings.broker_url)
    try:
        count, records = recent_dead_letters(client, settings.key_prefix, SHOWN)
    finally:
        client.close()
    if as_json:
        print(json.dumps({"dead_letters": count, "latest": [dataclasses.asdict(record) for record in records]}))
        return
    if not count:
        console.print("dead letters: none (no message was refused)", highlight=False)
        return
    console.print(f"dead letters: {count} messages refused for good; the latest {len(records)}:", highlight=False)
    for record in records:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(record.at))
        console.print(f"  {when}  {escape(record.queue)}  {escape(record.why)}", highlight=False)
        console.print(f"    body: {escape(record.body[:120])}", highlight=False)
