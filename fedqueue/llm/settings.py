"""How an LLM job generates: decoding settings, dtype and backend. Plain data, no torch: the submitting side reads it."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import Any

from fedqueue.errors import ConfigError

MAX_NEW_TOKENS_LIMIT = 100_000
DTYPES = ("auto", "float32", "bfloat16", "float16")
# The backend a job generates with unless it names another (fedqueue.llm.backends: the names there are).
DEFAULT_BACKEND = "transformers"


@dataclass(frozen=True)
class GenerationSettings:
    """Decoding settings shared by every prompt of a job.

    Sampling (temperature > 0) draws each prompt's tokens from its own generator, seeded from `seed` and the
    prompt's key, so a prompt's output does not depend on which other prompts share its batch. The limit: a
    batch's padding and shape change the logits in their last bits, so a draw that falls on a near-tie of the
    cumulative distribution can still differ between batchings. Greedy decoding (temperature 0) in float32
    does not have this problem in practice.

    `dtype` "auto" means float32 on a CPU, bfloat16 on a GPU that supports it and float16 on one that does not.
    """

    max_new_tokens: int = 64
    temperature: float = 0.0  # 0 = greedy
    top_p: float = 1.0
    seed: int = 0
    dtype: str = "auto"
    backend: str = DEFAULT_BACKEND  # checked against the installed backends where the job is checked

    def __post_init__(self) -> None:
        _check_int("max_new_tokens", self.max_new_tokens, 1, MAX_NEW_TOKENS_LIMIT)
        _check_number("temperature", self.temperature, "must be a number from 0 to 100", 0.0, 100.0)
        _check_number("top_p", self.top_p, "must be a number above 0 and at most 1", 0.0, 1.0, low_open=True)
        # JSON has one number type: an integer temperature or top_p is kept as the float it means.
        object.__setattr__(self, "temperature", float(self.temperature))
        object.__setattr__(self, "top_p", float(self.top_p))
        _check_int("seed", self.seed, 0, 2**63 - 1)
        _check_choice("dtype", self.dtype, DTYPES)
        if not isinstance(self.backend, str) or not self.backend:
            raise ConfigError("backend: must be the name of a backend")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, raw: Any) -> GenerationSettings:
        """Settings from a JSON-like mapping; missing fields take their defaults, unknown ones are refused."""
        if not isinstance(raw, dict):
            raise ConfigError("generation: must be a mapping of settings")
        known = {field.name for field in fields(cls)}
        unknown = sorted(str(name) for name in raw if name not in known)
        if unknown:
            raise ConfigError(f"{unknown[0]}: unknown generation setting (known: {', '.join(sorted(known))})")
        return cls(**raw)


def _check_int(name: str, value: Any, low: int, high: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise ConfigError(f"{name}: must be an integer from {low} to {high}")


def _check_number(name: str, value: Any, rule: str, low: float, high: float, low_open: bool = False) -> None:
    if not isinstance(value, float | int) or isinstance(value, bool) or not math.isfinite(value):
        raise ConfigError(f"{name}: {rule}")
    if value > high or value < low or (low_open and value == low):
        raise ConfigError(f"{name}: {rule}")


def _check_choice(name: str, value: Any, choices: tuple[str, ...]) -> None:
    if not isinstance(value, str) or value not in choices:
        raise ConfigError(f"{name}: must be one of {', '.join(choices)}")
