"""What a section is: a frozen dataclass of flat config keys, each with a default and a docstring.

A key's TOML type is read from its annotation here, so a section declares nothing twice; the one-line refusals
sections share live here too. A section's `check(run)` sees the run through `Run`, a protocol, so no section
imports the config that holds it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from types import UnionType
from typing import Any, ClassVar, Protocol, get_args, get_origin, get_type_hints, runtime_checkable

from fedqueue.errors import ConfigError, did_you_mean

# How a TOML value of each annotated type is checked: the Python types it may be (a float takes an int too) and the
# words an error names it with.
_ACCEPTED: dict[type, tuple[tuple[type, ...], str]] = {
    str: ((str,), "a string"),
    int: ((int,), "an integer"),
    float: ((float, int), "a number"),
    bool: ((bool,), "true or false"),
    dict: ((dict,), "a table"),
    list: ((list,), "a list"),
}


@dataclass(frozen=True)
class KeyType:
    """What a key's value may be: its Python types, the words an error names them with, whether None is one."""

    accepted: tuple[type, ...]
    words: str
    optional: bool


def key_types(section: type) -> dict[str, KeyType]:
    """Each key of `section` (a dataclass) with its type, read from its annotations.

    A field whose union the words of its parts would describe poorly says what it expects in its metadata; a
    field marked `SECTION` holds a section, not a key.
    """
    hints = get_type_hints(section)
    specs: dict[str, KeyType] = {}
    for spec in dataclasses.fields(section):
        if spec.metadata.get("section"):
            continue
        hint = hints[spec.name]
        members = get_args(hint) if isinstance(hint, UnionType) else (hint,)
        accepted: tuple[type, ...] = ()
        words: list[str] = []
        for member in members:
            if member is not type(None):
                python_types, word = _ACCEPTED[get_origin(member) or member]
                accepted += python_types
                words.append(word)
        specs[spec.name] = KeyType(accepted, spec.metadata.get("expected", " or ".join(words)), type(None) in members)
    return specs


# The metadata of a config field that holds a section rather than a key.
SECTION = {"section": True}


def own_keys(section: type) -> list[str]:
    """The keys `section` declares itself, in order: not those of a section it extends."""
    inherited = {
        spec.name for base in section.__mro__[1:] if dataclasses.is_dataclass(base) for spec in dataclasses.fields(base)
    }
    return [name for name in key_types(section) if name not in inherited]


def default_of(section: type, key: str) -> Any:
    spec = next(spec for spec in dataclasses.fields(section) if spec.name == key)
    return spec.default_factory() if spec.default_factory is not dataclasses.MISSING else spec.default


def check_type(key: str, value: Any, spec: KeyType) -> Any:
    """`value` as the key holds it (a float key's int as a float), else one line naming the key."""
    if value is None and spec.optional:
        return None
    # bool is an int subclass in Python; `rounds = true` is still a mistake.
    if (isinstance(value, bool) and bool not in spec.accepted) or not isinstance(value, spec.accepted):
        raise ConfigError(f"{key}: expected {spec.words}, got {type(value).__name__} {value!r}")
    if float in spec.accepted and not isinstance(value, str):
        value = float(value)  # type: ignore[arg-type]  # an int or a float: checked just above
        if value != value or value in (float("inf"), float("-inf")):
            raise ConfigError(f"{key}: expected a finite number, got {value!r}")
    return value


def positive(key: str, value: int) -> None:
    if value <= 0:
        raise ConfigError(f"{key}: must be a positive integer, got {value}")


def choice(key: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ConfigError(f"{key}: unknown {key} {value!r} (choose from {', '.join(choices)})")


def check_table(key: str, table: dict[str, Any], allowed: tuple[str, ...]) -> None:
    """A table's keys, each one of `allowed`, else one line with the closest."""
    for name in table:
        if name not in allowed:
            hint = did_you_mean(name, allowed) or f" (known: {', '.join(allowed)})"
            raise ConfigError(f"{key}: unknown setting {name!r}{hint}")


class Run(Protocol):
    """What a section's check may read of the run beside its own keys."""

    @property
    def mode(self) -> str: ...
    @property
    def num_devices(self) -> int: ...
    @property
    def devices_per_round(self) -> int: ...
    @property
    def global_lr(self) -> float: ...
    @property
    def last_version(self) -> int | None: ...
    @property
    def kd_split(self) -> float: ...


@runtime_checkable
class Section(Protocol):
    """A section: a frozen dataclass of keys whose `check` refuses, in one line naming the key, what it cannot run."""

    __dataclass_fields__: ClassVar[dict[str, Any]]

    def check(self, run: Run) -> None: ...
