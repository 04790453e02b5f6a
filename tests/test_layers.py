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


def _module_path(name: str) -> Path | None:
    """The source file of a fedqueue module (a package's __init__.py), or None when it is not one."""
    base = PACKAGE.parent.joinpath(*name.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def _import_nodes(tree: ast.AST, at_import: bool) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement, or with `at_import` those run when the module is imported: not in a function
    body, not under `if TYPE_CHECKING:`."""
    if not at_import:
        return [node for node in ast.walk(tree) if isinstance(node, ast.Import | ast.ImportFrom)]
    found: list[ast.Import | ast.ImportFrom] = []
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            found.append(node)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            continue
        elif isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            for branch in node.orelse:
                found += _import_nodes(branch, at_import)
        else:
            found += _import_nodes(node, at_import)
    return found


def imported_modules(path: Path, at_import: bool = False) -> dict[str, list[str]]:
    """fedqueue modules a source file imports (`from fedqueue.x import y` names x.y where y is a module),
    each with the lines doing it; with `at_import`, only the imports run when the file is imported."""
    found: dict[str, list[str]] = {}
    label = path.relative_to(PACKAGE.parent) if path.is_relative_to(PACKAGE) else path.name
    for node in _import_nodes(ast.parse(path.read_text()), at_import):
        if isinstance(node, ast.ImportFrom):
            if node.level != 0 or not node.module:
                continue
            module = node.module
            names = [
                f"{module}.{alias.name}" if _module_path(f"{module}.{alias.name}") or module == "fedqueue" else module
                for alias in node.names
            ]
        else:
            names = [alias.name for alias in node.names]
        for name in names:
            if name.startswith("fedqueue.") and name.count(".") >= 1:
                found.setdefault(name, []).append(f"{label}:{node.lineno}")
    return found


def imported_packages(path: Path) -> dict[str, list[str]]:
    """fedqueue's top-level packages (and modules) a source file imports, each with the lines doing it."""
    found: dict[str, list[str]] = {}
    for name, where in imported_modules(path).items():
        found.setdefault(name.split(".")[1], []).extend(where)
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


# The one core module FL's machine-learning code may read: which GPUs the environment shows (standard library only).
FL_PURE_MAY_IMPORT = {"fedqueue.core.gpus"}


@pytest.mark.parametrize("module", sorted(FL_PURE))
def test_fl_machine_learning_code_imports_no_core_and_no_orchestration(module: str) -> None:
    path = PACKAGE / "fl" / f"{module.replace('.', '/')}.py"
    reached = {name.split(".")[1] for name in imported_modules(path).keys() - FL_PURE_MAY_IMPORT} - {"fl", "errors"}
    assert not reached, f"fl/{module} imports fedqueue.{reached}"
    orchestration = fl_modules_imported(path) - FL_PURE
    assert not orchestration, f"fl/{module} imports fl modules above it: {sorted(orchestration)}"


@pytest.mark.parametrize("module", sorted(FL_PURE_MAY_IMPORT))
def test_what_fl_machine_learning_code_may_import_of_the_core_imports_nothing_of_fedqueue(module: str) -> None:
    path = _module_path(module)
    assert path is not None, module
    assert not imported_modules(path), imported_modules(path)


# Worker side: what a worker runs for a task. It may ask for scheduler steps (fedqueue.fl.requests) and call the
# strategy seam (fedqueue.fl.strategy), never import the code that plans rounds, aggregates or repairs them.
WORKER_SIDE = [
    "fl/device_task.py",
    "fl/pack_train.py",
    "fl/train.py",
    "fl/data.py",
    "fl/models.py",
    "fl/seeding.py",
    "fl/weights.py",
    "fl/timing.py",
    "fl/pack_cache.py",
    "llm/worker.py",
    "llm/generate.py",
    "llm/progress.py",
]
SCHEDULER_SIDE = {
    "fedqueue.fl.rounds",
    "fedqueue.fl.repair",
    "fedqueue.fl.strategy.synchronous",
    "fedqueue.fl.strategy.buffered",
    "fedqueue.fl.strategy.fedbuff",
    "fedqueue.fl.strategy.schedule",
    "fedqueue.fl.strategy.revived",
    "fedqueue.llm.repair",
    "fedqueue.llm.planner",
    "fedqueue.llm.job",
}


@pytest.mark.parametrize("module", WORKER_SIDE)
def test_no_worker_module_imports_scheduler_code(module: str) -> None:
    imports = imported_modules(PACKAGE / module)
    assert not SCHEDULER_SIDE & imports.keys(), {name: imports[name] for name in SCHEDULER_SIDE & imports.keys()}


def loaded_on_import(module: str) -> set[str]:
    """The fedqueue modules that importing `module` loads: its imports run at import time, theirs, and so on
    (the packages above each module included)."""
    loaded: set[str] = set()
    waiting = [module]
    while waiting:
        name = waiting.pop()
        parts = name.split(".")
        for depth in range(2, len(parts) + 1):
            prefix = ".".join(parts[:depth])
            path = _module_path(prefix)
            if prefix in loaded or path is None:
                continue
            loaded.add(prefix)
            waiting += imported_modules(path, at_import=True)
    return loaded


@pytest.mark.parametrize(
    "module",
    [
        "fedqueue.fl.device_task",
        # What a worker storing a result of a synchronous run loads through the strategy seam.
        "fedqueue.fl.strategy.synchronous",
    ],
)
def test_a_worker_storing_a_result_does_not_load_the_round_scheduler(module: str) -> None:
    assert "fedqueue.fl.rounds" not in loaded_on_import(module)


def test_the_import_closure_follows_module_imports_and_skips_lazy_and_type_only_ones(tmp_path: Path) -> None:
    module = tmp_path / "lazy.py"
    module.write_text(
        "from typing import TYPE_CHECKING\n"
        "from fedqueue.fl import rounds\n"
        "import fedqueue.core.keys\n"
        "if TYPE_CHECKING:\n"
        "    from fedqueue.fl.repair import reconcile\n"
        "def f():\n"
        "    from fedqueue.llm.repair import reconcile\n"
    )
    assert imported_modules(module, at_import=True) == {
        "fedqueue.fl.rounds": ["lazy.py:2"],
        "fedqueue.core.keys": ["lazy.py:3"],
    }
    assert imported_modules(module).keys() == {
        "fedqueue.fl.rounds",
        "fedqueue.core.keys",
        "fedqueue.fl.repair",
        "fedqueue.llm.repair",
    }
    assert "fedqueue.fl.rounds" in loaded_on_import("fedqueue.fl.repair")  # followed through fedqueue.fl.repair
