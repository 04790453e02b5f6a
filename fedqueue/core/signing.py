"""Signed task messages: an HMAC-SHA256 over each message's task name and JSON body, from FEDQUEUE_MESSAGE_KEY.

Where everyone who can reach Redis is trusted, messages go unsigned (JSON only already keeps code from
running). Where not, every process of a deployment is given the same secret: publishers sign each message,
and workers run only messages whose signature matches, dead-lettering the rest. The body is signed as
canonical JSON (sorted keys, no spaces), which both ends compute from the same decoded values.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from typing import Any


def _canonical(task: str, body: Any) -> bytes:
    return f"{task}\n{json.dumps(body, sort_keys=True, separators=(',', ':'), allow_nan=True)}".encode()


def sign(key: str, task: str, body: Any) -> str:
    return hmac.new(key.encode(), _canonical(task, body), hashlib.sha256).hexdigest()


def verify(key: str, task: str, body: Any, signature: Any) -> bool:
    """Whether `signature` is `sign(key, task, body)`; any other value (none, not text) is not."""
    if not isinstance(signature, str):
        return False
    try:
        expected = sign(key, task, body)
    except (TypeError, ValueError, RecursionError):  # a body JSON cannot write was never signed
        return False
    return hmac.compare_digest(expected, signature)
