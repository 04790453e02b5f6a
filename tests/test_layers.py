"""Which fedqueue packages may import which: job kinds import the core, never the reverse.

Read from the source (every import statement, at module level or in a function), so a lazy
import inside a function counts as much as one at the top of a module.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "fedqueue"
KINDS = {"fl", "llm"}
# What each part of the core may import of fedqueue (besides itself); config and errors are shared by all.
ALLOWED = {
    "store": {"config", "errors"},
    "core": {"config", "errors", "store"},
    "queue": {"config", "errors", "store", "core"},
    "report": {"config", "errors", "store", "core"},
    # The front door: the Python API (api.py) and the `fedqueue` command over every layer, kinds reached
    # only through the registry (their commands, bars and status come from their JobKind).
    "api": {"config", "errors", "store", "core", "queue", "report"},
    "cli": {"config", "errors", "store", "core", "queue", "report", "api"},
}


def imported_packages(path: Path) -> dict[str, list[str]]:
    """fedqueue's top-level packages (and modules) a source file imports, each with the lines doing it."""
    found: dict[str, list[str]] = {}
    label = path.relative_to(PACKAGE.parent) if path.is_relative_to(PACKAGE) else path.name
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = (
                [f"{node.module}.{alias.name}" for alias in node.names] if node.module == "fedqueue" else [node.module]
            )
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            continue
        for name in names:
            parts = name.split(".")
            if parts[0] == "fedqueue" and len(parts) > 1:
                found.setdefault(parts[1], []).append(f"{label}:{node.lineno}")
    return found


def package_imports(package: str) -> dict[str, list[str]]:
    """What a package (or a top-level module, such as api.py) imports of the rest of fedqueue."""
    imports: dict[str, list[str]] = {}
    module = PACKAGE / f"{package}.py"
    for path in [module] if module.exists() else sorted((PACKAGE / package).rglob("*.py")):
        for target, where in imported_packages(path).items():
            if target != package:
                imports.setdefault(target, []).extend(where)
    return imports


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_the_core_imports_no_job_kind_and_only_the_layers_below_it(package: str) -> None:
    imports = package_imports(package)
    assert not KINDS & imports.keys(), {kind: imports[kind] for kind in KINDS & imports.keys()}
    assert imports.keys() <= ALLOWED[package], {name: imports[name] for name in imports.keys() - ALLOWED[package]}


def test_the_check_sees_every_form_of_import_even_inside_functions(tmp_path: Path) -> None:
    module = tmp_path / "lazy.py"
    module.write_text(
        "from fedqueue import llm\n"
        "import fedqueue.report.summary\n"
        "def f():\n"
        "    from fedqueue.fl.config import RunConfig\n"
    )
    assert imported_packages(module) == {"llm": ["lazy.py:1"], "report": ["lazy.py:2"], "fl": ["lazy.py:4"]}


# FL's machine-learning code: torch and numbers only, no store, no broker, no scheduling. The rest of fl/
# (rounds, strategies' passes, the device task, repair) orchestrates above it. Plugins import these
# modules by path (`fedqueue.fl.models:mlp`), so the split is held here rather than by moving files.
FL_PURE = {
    "aggregate",
    "cifar_fixture",
    "clock",
    "data",
    "devices",
    "evaluate",
    "models",
    "pack_train",
    "packing",
    "plugins",
    "revive",
    "seeding",
    "staleness",
    "synthesis",
    "train",
    "trial_update",
    "warmup",
    "weights",
    "strategy.schedule",
}


def fl_modules_imported(path: Path) -> set[str]:
    """The fedqueue.fl modules a source file imports, as names under fl/ (`strategy.schedule`)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [f"{node.module}.{alias.name}" for alias in node.names] + [node.module]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            continue
        for name in names:
            if name.startswith("fedqueue.fl."):
                module = name.removeprefix("fedqueue.fl.")
                if (PACKAGE / "fl" / f"{module.replace('.', '/')}.py").exists():
                    found.add(module)
    return found


@pytest.mark.parametrize("module", sorted(FL_PURE))
def test_fl_machine_learning_code_imports_no_core_and_no_orchestration(module: str) -> None:
    path = PACKAGE / "fl" / f"{module.replace('.', '/')}.py"
    reached = imported_packages(path).keys() - {"fl", "errors"}
    assert not reached, f"fl/{module} imports fedqueue.{reached}"
    orchestration = fl_modules_imported(path) - FL_PURE
    assert not orchestration, f"fl/{module} imports fl modules above it: {sorted(orchestration)}"
