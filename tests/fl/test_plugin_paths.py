"""Every FL import path the README, the docs site and the examples show imports, and so do the paths they showed
before fl/ was split into rooms: user configs and plugins name them.

The paths shown now are read from the documents themselves, so one added to them is checked with no list to update.
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCUMENTS = [
    ROOT / "README.md",
    *sorted((ROOT / "docs").rglob("*.md")),
    *sorted((ROOT / "examples").rglob("*.py")),
    *sorted((ROOT / "examples").glob("*.toml")),
]
# `fedqueue.fl.models:mlp` in a config or the README, and `from fedqueue.fl.aggregate import fedavg, counts_of`.
PLUGIN_PATH = re.compile(r"\b(fedqueue\.fl(?:\.\w+)+):(\w+)")
FROM_IMPORT = re.compile(r"^\s*from (fedqueue\.fl(?:\.\w+)*) import ([\w, ]+)$", re.MULTILINE)


# What the README and examples showed before fl/ had rooms (user configs and plugins were written against them).
EARLIER_PATHS = {
    ("fedqueue.fl.models", "mlp"),
    ("fedqueue.fl.aggregate", "fedavg_rule"),
    ("fedqueue.fl.aggregate", "LoadedOnUse"),
    ("fedqueue.fl.aggregate", "counts_of"),
    ("fedqueue.fl.aggregate", "fedavg"),
    ("fedqueue.fl.plugins", "Update"),
    ("fedqueue.fl.plugins", "DatasetRequest"),
    ("fedqueue.fl.plugins", "LoadedDataset"),
    ("fedqueue.fl.data", "TensorData"),
}


def documented_paths() -> list[tuple[str, str]]:
    found: set[tuple[str, str]] = set(EARLIER_PATHS)
    for document in DOCUMENTS:
        text = document.read_text()
        found.update(PLUGIN_PATH.findall(text))
        for module, names in FROM_IMPORT.findall(text):
            found.update((module, name.strip()) for name in names.split(","))
    return sorted(found)


def test_the_documents_name_the_paths_users_write() -> None:
    shown = set(documented_paths()) - EARLIER_PATHS
    assert ("fedqueue.fl.ml.models", "mlp") in shown
    assert any(module == "fedqueue.fl.ml.plugins" for module, _ in shown)


@pytest.mark.parametrize(("module", "name"), documented_paths(), ids=lambda part: str(part))
def test_a_documented_path_imports(module: str, name: str) -> None:
    imported = importlib.import_module(module)
    if not hasattr(imported, name):  # `from fedqueue.fl import api` names a module
        importlib.import_module(f"{module}.{name}")


@pytest.mark.parametrize("module", ["models", "aggregate", "data", "plugins"])
def test_an_earlier_path_is_the_same_module_as_its_new_one(module: str) -> None:
    # One module object: a plugin's monkeypatch or isinstance check sees what fedqueue itself uses.
    assert importlib.import_module(f"fedqueue.fl.{module}") is importlib.import_module(f"fedqueue.fl.ml.{module}")
