"""Settings from the environment: secrets, defaults, refusals."""

from __future__ import annotations

import pytest

from fedqueue.config import Settings, insecure_broker, mask_url
from fedqueue.errors import ConfigError


def test_redis_password_comes_from_its_own_variable_and_is_never_shown() -> None:
    settings = Settings.from_env({"FEDQUEUE_BROKER_URL": "redis://redis:6379/0", "FEDQUEUE_REDIS_PASSWORD": "p@ss/w"})
    assert settings.broker_url == "redis://:p%40ss%2Fw@redis:6379/0"
    assert "p%40ss" not in mask_url(settings.broker_url) and "***" in mask_url(settings.broker_url)
    # A password already in the URL wins.
    kept = Settings.from_env({"FEDQUEUE_BROKER_URL": "redis://:inurl@h:1/0", "FEDQUEUE_REDIS_PASSWORD": "env"})
    assert kept.broker_url == "redis://:inurl@h:1/0"


@pytest.mark.parametrize(
    ("url", "insecure"),
    [
        ("redis://127.0.0.1:6379/0", False),
        ("redis://localhost:6379/0", False),
        ("redis://redis:6379/0", True),
        ("redis://:secret@redis:6379/0", False),
        ("rediss://10.0.0.5:6380/0", True),
        (None, False),
    ],
)
def test_a_redis_beyond_loopback_without_password_is_flagged(url: str | None, insecure: bool) -> None:
    assert insecure_broker(url) is insecure


def test_settings_round_trip_through_the_environment() -> None:
    settings = Settings(
        broker_url="redis://h:1/0",
        key_prefix="p",
        heartbeat_ttl_s=4,
        plugin_path=("/a", "/b"),
        visibility_timeout_override_s=9,
    )
    assert Settings.from_env(settings.to_env()) == settings
    assert Settings().visibility_timeout_s > Settings().task_time_limit_s  # never redelivered while running


@pytest.mark.parametrize(
    ("variable", "value"),
    [("FEDQUEUE_MAX_ATTEMPTS", "0"), ("FEDQUEUE_THREADS_PER_TASK", "two"), ("FEDQUEUE_KEY_PREFIX", "a b")],
)
def test_bad_settings_name_the_variable(variable: str, value: str) -> None:
    with pytest.raises(ConfigError, match=variable):
        Settings.from_env({variable: value})
