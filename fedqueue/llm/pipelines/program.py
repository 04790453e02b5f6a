"""A pipeline program named by import path (`mypkg.refine:program`), imported as FL plugins are.

A program is a generator function of one item (the input line's JSON value): it yields `Generate` requests,
receives each one's output text, and returns the item's result (JSON data).
"""

from __future__ import annotations

import functools
import importlib
import inspect
import re
from collections.abc import Callable, Generator
from typing import Any

from fedqueue.errors import ConfigError

Program = Callable[[Any], Generator[Any, str, Any]]
IMPORT_PATH = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")


def load_program(path: str, field: str = "program") -> Program:
    """The generator function at `path`; a ConfigError of one line naming `field` when it is not one."""
    return _load(path, field)


@functools.lru_cache(maxsize=16)
def _load(path: str, field: str) -> Program:
    if not isinstance(path, str) or not IMPORT_PATH.match(path):
        raise ConfigError(f"{field}: {path!r} is not an import path like mypkg.module:function")
    module_name, _, attribute = path.partition(":")
    try:
        target: Any = importlib.import_module(module_name)
    except Exception as error:  # a program's import can fail in any way: the user sees which and why
        first = (str(error).strip().splitlines() or [""])[0]
        hint = "; a module in a folder of yours: add --plugin-path FOLDER" if isinstance(error, ImportError) else ""
        raise ConfigError(f"{field}: cannot import {module_name!r} ({type(error).__name__}: {first}){hint}") from None
    for part in attribute.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise ConfigError(f"{field}: module {module_name!r} has no attribute {attribute!r}") from None
    if not inspect.isgeneratorfunction(target):
        raise ConfigError(f"{field}: {path} is not a generator function (it must yield Generate requests)")
    program: Program = target
    return program
