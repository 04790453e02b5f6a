"""`fedqueue ARGS...` with its broker shut down once, at one point of the run's submit: `python cut_submit.py POINT ARGS`.

The points, each reached by the code itself (no timing):
  before-row   the submit asks the broker for its identity, the last step before the run's row is stored
  after-row    the run's row was just stored; its model and first tasks are not sent yet
  mid-publish  the first half of round 1's tasks was sent, the rest not yet
The broker is FEDQUEUE_BROKER_URL's, else the embedded Redis this command starts; the caller starts it again.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Sequence
from typing import Any

import redis

from fedqueue.config import Settings
from fedqueue.core.broker.ledger import RedisLedger
from fedqueue.queue import publish
from fedqueue.store.repo import Store

POINTS = ("before-row", "after-row", "mid-publish")
fired = False


def stop_broker(url: str) -> None:
    """SHUTDOWN NOSAVE, once: the Redis exits and forgets everything, as a killed one does."""
    global fired
    if fired:
        return
    fired = True
    client = redis.Redis.from_url(url)
    with contextlib.suppress(redis.ConnectionError):  # its answer to SHUTDOWN is the connection closing
        client.shutdown(nosave=True)
    client.close()
    sys.stderr.write(f"[cut_submit] broker shut down at {point}\n")


def before_row(original: Callable[[RedisLedger], str]) -> Callable[[RedisLedger], str]:
    def broker_id(self: RedisLedger) -> str:
        stop_broker(self.settings.broker_url or "")
        return original(self)

    return broker_id


def after_row(original: Callable[..., Any]) -> Callable[..., Any]:
    def create_run(self: Store, *args: Any, **kwargs: Any) -> Any:
        created = original(self, *args, **kwargs)
        stop_broker(broker_url)
        return created

    return create_run


def mid_publish(original: Callable[..., None]) -> Callable[..., None]:
    def _publish(app: Any, settings: Settings, messages: Sequence[Any]) -> None:
        if fired or len(messages) < 2:
            return original(app, settings, messages)
        half = len(messages) // 2
        original(app, settings, messages[:half])
        stop_broker(settings.broker_url or "")
        return original(app, settings, messages[half:])

    return _publish


# Guarded: `fedqueue run` prepares the submit in a spawned process, which imports this script again.
if __name__ == "__main__":
    point, *arguments = sys.argv[1:]
    assert point in POINTS, point
    broker_url = Settings.from_env().broker_url or ""
    if point == "before-row":
        # mypy types a method read off its class as bound, so a replacement with its self argument does not match.
        RedisLedger.broker_id = before_row(RedisLedger.broker_id)  # type: ignore[method-assign, assignment]
    elif point == "after-row":
        Store.create_run = after_row(Store.create_run)  # type: ignore[method-assign]
    else:
        publish._publish = mid_publish(publish._publish)  # type: ignore[assignment]
    sys.argv = ["fedqueue", *arguments]

    from fedqueue.cli.commands import main  # after the patches, as a user's command starts

    main()
