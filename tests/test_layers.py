"""Which fedqueue packages may import which: job kinds import the core, never the reverse.

Read from the source (every import statement, at module level or in a function), so a lazy
import inside a function counts as much as one at the top of a module.
"""

from __future__ import annotations

import ast
import subprocess
import sys
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
    # A run of any kind once submitted (handle.py), and how one is launched (launch.py): what the front door uses.
    "handle": {"config", "errors", "store", "core", "queue", "report"},
    "launch": {"config", "errors", "store", "core", "queue", "report", "handle"},
    # The front door: the Python API (api.py) and the `fedqueue` command over every layer, kinds reached
    # only through the registry (their commands, bars and status come from their JobKind).
    "api": {"config", "errors", "store", "core", "queue", "report", "handle", "launch"},
    "cli": {"config", "errors", "store", "core", "queue", "report", "api", "handle", "launch"},
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


# FL's rooms, by folder: a new file is held to its folder's rule with no list to update.
FL = PACKAGE / "fl"
# ... and of the core, one stdlib-only module: which GPUs the environment shows; its config sections read what a
# section is (fl/sections/base.py, stdlib only).
FL_ML_MAY_IMPORT = ("fedqueue.errors", "fedqueue.fl.ml.", "fedqueue.core.process.gpus", "fedqueue.fl.sections.base")
# What a worker's own code never imports: how runs are planned, repaired, shown or submitted. It reaches its
# run's strategy through the protocol (fl/strategy/base.py) that the kind hands it.
FL_WORKER_NEVER = (
    "fedqueue.fl.strategy.",
    "fedqueue.fl.scheduler",
    "fedqueue.fl.view.",
    "fedqueue.fl.cli",
    "fedqueue.fl.api",
)


def _sources(folder: Path) -> list[Path]:
    return sorted(path for path in folder.rglob("*.py") if "migrations" not in path.parts)


def _label(path: Path) -> str:
    return str(path.relative_to(PACKAGE.parent))


@pytest.mark.parametrize("path", _sources(FL / "ml"), ids=_label)
def test_fl_machine_learning_code_imports_nothing_but_itself(path: Path) -> None:
    imports = imported_modules(path)
    outside = {name: where for name, where in imports.items() if not name.startswith(FL_ML_MAY_IMPORT)}
    assert not outside, outside


def test_the_core_module_fl_machine_learning_code_reads_imports_nothing_of_fedqueue() -> None:
    path = _module_path("fedqueue.core.process.gpus")
    assert path is not None
    assert not imported_modules(path), imported_modules(path)


@pytest.mark.parametrize("path", _sources(FL / "worker"), ids=_label)
def test_fl_worker_code_imports_no_scheduler_code(path: Path) -> None:
    imports = imported_modules(path)
    allowed = {"fedqueue.fl.strategy.base"}
    found = {name: where for name, where in imports.items() if name.startswith(FL_WORKER_NEVER) and name not in allowed}
    assert not found, found


@pytest.mark.parametrize(("strategy", "other"), [("sync", "fedbuff"), ("fedbuff", "sync")])
def test_the_two_strategies_do_not_import_each_other(strategy: str, other: str) -> None:
    for path in _sources(FL / "strategy" / strategy):
        imports = imported_modules(path)
        found = {name: where for name, where in imports.items() if name.startswith(f"fedqueue.fl.strategy.{other}")}
        assert not found, found


def test_fl_keeps_at_most_twelve_modules_at_its_top() -> None:
    # Past a dozen, a reader of fl/ no longer sees its rooms: a new concept gets a folder of its own.
    modules = sorted(path.name for path in FL.glob("*.py"))
    assert len(modules) <= 12, modules


@pytest.mark.parametrize("path", _sources(FL / "clock"), ids=_label)
def test_simulated_time_reads_nothing_but_its_config(path: Path) -> None:
    # The clock and the stop rules read the config alone (no store, no broker, no model), so they test alone; its
    # section reads what a section is (fl/sections/base.py, stdlib only).
    imports = imported_modules(path)
    inside = ("fedqueue.errors", "fedqueue.fl.clock.", "fedqueue.fl.sections.base")
    outside = {name: where for name, where in imports.items() if not name.startswith(inside)}
    assert not outside, outside


def test_the_folder_rules_see_a_new_file(tmp_path: Path) -> None:
    # The rules read each folder afresh: a module added to fl/ml/ that imports the store is caught.
    stray = tmp_path / "stray.py"
    stray.write_text("from fedqueue.store import Store\nfrom fedqueue.fl.ml.data import load_federated\n")
    with pytest.raises(AssertionError, match="fedqueue.store"):
        test_fl_machine_learning_code_imports_nothing_but_itself(stray)


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


def reached(module: str) -> set[str]:
    """Every fedqueue module that `module` can load, at import or later: each import followed, lazy ones too."""
    found: set[str] = set()
    waiting = [module]
    while waiting:
        name = waiting.pop()
        path = _module_path(name)
        if name in found or path is None:
            continue
        found.add(name)
        waiting += imported_modules(path)
    return found


def test_an_llm_worker_never_reaches_the_job_planner_or_its_repair() -> None:
    scheduler_side = {"fedqueue.llm.repair", "fedqueue.llm.planner", "fedqueue.llm.job"}
    assert not scheduler_side & reached("fedqueue.llm.worker")


def test_the_command_line_and_the_kinds_load_no_torch_celery_or_matplotlib() -> None:
    # Every command and every worker launcher loads these; torch, Celery and matplotlib wait for the work.
    script = (
        "import sys, fedqueue, fedqueue.cli.commands, fedqueue.fl.kind, fedqueue.llm.kind, fedqueue.fl.api\n"
        "print(sorted(name for name in ('torch', 'celery', 'matplotlib', 'transformers') if name in sys.modules))"
    )
    loaded = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout
    assert loaded.strip() == "[]"


def import_graph() -> dict[str, set[str]]:
    """fedqueue's modules and what each imports of the others, every import counted (in functions and under
    TYPE_CHECKING too); `from a import b` counts as importing package a as well as module a.b."""
    modules = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        if "migrations" in path.parts:
            continue
        name = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts).removesuffix(".__init__")
        modules[name] = path
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                targets.add(node.module)
                targets.update(f"{node.module}.{alias.name}" for alias in node.names)
            elif isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
        graph[name] = {target for target in targets if target in modules and target not in (name, "fedqueue")}
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    cycles.append(sorted(component))
    return cycles


def test_no_import_cycle_anywhere_in_fedqueue() -> None:
    assert import_cycles(import_graph()) == []


def test_the_cycle_check_finds_a_loop_through_a_function_level_import() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert import_cycles(graph) == [["a", "b", "c"]]
    assert import_cycles({"a": {"b"}, "b": set()}) == []


def test_the_import_closure_follows_module_imports_and_skips_lazy_and_type_only_ones(tmp_path: Path) -> None:
    module = tmp_path / "lazy.py"
    module.write_text(
        "from typing import TYPE_CHECKING\n"
        "from fedqueue.fl.strategy.sync import rounds\n"
        "import fedqueue.core.broker.keys\n"
        "if TYPE_CHECKING:\n"
        "    from fedqueue.fl.strategy.sync.repair import reconcile\n"
        "def f():\n"
        "    from fedqueue.llm.repair import reconcile\n"
    )
    assert imported_modules(module, at_import=True) == {
        "fedqueue.fl.strategy.sync.rounds": ["lazy.py:2"],
        "fedqueue.core.broker.keys": ["lazy.py:3"],
    }
    assert imported_modules(module).keys() == {
        "fedqueue.fl.strategy.sync.rounds",
        "fedqueue.core.broker.keys",
        "fedqueue.fl.strategy.sync.repair",
        "fedqueue.llm.repair",
    }
    # Followed through the repair module's own imports.
    assert "fedqueue.fl.strategy.sync.rounds" in loaded_on_import("fedqueue.fl.strategy.sync.repair")


CORE = PACKAGE / "core"


def test_core_keeps_at_most_twelve_modules_at_its_top() -> None:
    # As for fl/: a new concept of the core gets a room (a folder) of its own.
    modules = sorted(path.name for path in CORE.glob("*.py"))
    assert len(modules) <= 12, modules
