"""Reading a run config file: fedqueue's TOML, or FedRevive's own JSON experiment file as it is.

A JSON file in their format is translated key by key (fedqueue.fl.config_files.fedrevive_json); the keys that mean
nothing here come back as notes for the command to print. Validation is RunConfig's, after this.
"""

from __future__ import annotations

import json
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedqueue.errors import ConfigError
from fedqueue.fl.config_files.fedrevive_json import is_fedrevive_json, translate


@dataclass
class ConfigFile:
    raw: dict[str, Any]  # fedqueue's keys, before validation
    notes: list[str] = field(default_factory=list)  # keys read and ignored, one line each
    fedrevive: bool = False  # FedRevive's own JSON experiment file, translated
    origins: dict[str, str] = field(default_factory=dict)  # a foreign file's key behind each fedqueue key

    def named_as_written(self, err: ConfigError) -> ConfigError:
        """RunConfig's refusal of a translated key, naming the key as the file wrote it."""
        field_name, sep, rest = str(err).partition(":")
        origin = self.origins.get(field_name)
        if not sep or origin is None:
            return err
        return ConfigError(f"{origin} (fedqueue's {field_name}):{rest}")


def read_config_file(path: Path) -> ConfigFile:
    text = _text(path)
    if path.suffix.lower() != ".json":
        try:
            return ConfigFile(tomllib.loads(text))
        except tomllib.TOMLDecodeError as err:
            raise ConfigError(f"config: {path}: invalid TOML: {err}") from None
        except RecursionError:
            raise ConfigError(f"config: {path}: TOML nested too deep to be a config") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise ConfigError(f"config: {path}: invalid JSON: {err.msg} (line {err.lineno}, column {err.colno})") from None
    except RecursionError:
        raise ConfigError(f"config: {path}: JSON nested too deep to be a config") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config: {path}: expected a JSON object, got {type(data).__name__}")
    if not is_fedrevive_json(data):
        return ConfigFile(data)
    translation = translate(data, name=path.stem)
    return ConfigFile(translation.raw, translation.notes, fedrevive=True, origins=translation.origins)


def _text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"config: file {str(path)!r} does not exist") from None
    except IsADirectoryError:
        raise ConfigError(f"config: {str(path)!r} is a folder, not a config file") from None
    except UnicodeDecodeError:
        raise ConfigError(f"config: {str(path)!r} is not UTF-8 text") from None
