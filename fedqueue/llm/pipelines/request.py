"""What a pipeline program yields: one generation request, a prompt or chat messages with its decoding settings.

Plain data, no torch. Settings left None take the pipeline's own (`--max-new-tokens`, `--temperature`, ...).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from fedqueue.llm.prompts import ROLES
from fedqueue.llm.settings import GenerationSettings

OVERRIDABLE = ("max_new_tokens", "temperature", "top_p")  # what one request may set for itself


class RequestError(ValueError):
    """A yielded value that is not a usable request; its message says what is wrong."""


@dataclass(frozen=True)
class Generate:
    """Generate from `prompt` (text) or `messages` ([{"role", "content"}, ...] or (role, content) pairs)."""

    prompt: str | None = None
    messages: Sequence[Any] | None = None
    max_new_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None

    def __post_init__(self) -> None:
        if (self.prompt is None) == (self.messages is None):
            raise RequestError("Generate: give exactly one of prompt or messages")
        if self.prompt is not None and (not isinstance(self.prompt, str) or not self.prompt):
            raise RequestError("Generate.prompt: must be a non-empty string")
        if self.messages is not None:
            object.__setattr__(self, "messages", _pairs(self.messages))
        # The settings are checked as a job's are: a bad one names its field.
        try:
            self.settings(GenerationSettings())
        except Exception as error:
            raise RequestError(f"Generate.{error}") from None

    def settings(self, default: GenerationSettings) -> GenerationSettings:
        """The pipeline's settings with this request's own in their place."""
        own = {name: getattr(self, name) for name in OVERRIDABLE if getattr(self, name) is not None}
        return replace(default, **own) if own else default

    def to_dict(self) -> dict[str, Any]:
        """As stored: only what is set, so equal requests store equal JSON."""
        raw: dict[str, Any] = {"prompt": self.prompt} if self.prompt is not None else {}
        if self.messages is not None:
            raw["messages"] = [list(pair) for pair in self.messages]
        raw.update({name: getattr(self, name) for name in OVERRIDABLE if getattr(self, name) is not None})
        return raw

    @property
    def settings_key(self) -> str:
        """The request's own settings as one string: calls batched together share it."""
        own = {name: getattr(self, name) for name in OVERRIDABLE if getattr(self, name) is not None}
        return json.dumps(own, sort_keys=True)

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> Generate:
        return cls(**dict(raw))

    @property
    def pairs(self) -> tuple[tuple[str, str], ...] | None:
        return None if self.messages is None else tuple(tuple(pair) for pair in self.messages)


def _pairs(messages: Sequence[Any]) -> tuple[tuple[str, str], ...]:
    if isinstance(messages, str | bytes) or not isinstance(messages, Sequence) or not messages:
        raise RequestError("Generate.messages: must be a non-empty list of {role, content}")
    pairs = []
    for index, message in enumerate(messages):
        if isinstance(message, Mapping):
            role, content = message.get("role"), message.get("content")
        elif isinstance(message, Sequence) and not isinstance(message, str) and len(message) == 2:
            role, content = message
        else:
            raise RequestError(f"Generate.messages[{index}]: must be {{role, content}} or a (role, content) pair")
        if role not in ROLES or not isinstance(content, str):
            raise RequestError(
                f"Generate.messages[{index}]: role must be one of {', '.join(ROLES)} and content a string"
            )
        pairs.append((str(role), content))
    return tuple(pairs)
