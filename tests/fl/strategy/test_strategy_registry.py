"""Strategies are reached by their mode through the registry: one entry per mode the config accepts, and no
module outside fl/strategy/ asks `is_buffered` or compares a mode with a mode's name."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from fedqueue.fl import config
from fedqueue.fl.kind import KIND
from fedqueue.fl.strategy.modes import MODES
from fedqueue.fl.strategy.registry import REGISTRY, strategy_for

PACKAGE = Path(__file__).resolve().parents[3] / "fedqueue"
STRATEGIES = PACKAGE / "fl" / "strategy"


def _names_a_mode(node: ast.expr) -> bool:
    """A mode's name, or several (`in ("fedbuff", "fedrevive")`)."""
    if isinstance(node, ast.Constant):
        return node.value in MODES
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return any(_names_a_mode(item) for item in node.elts)
    return False


def _reads_a_mode(node: ast.expr) -> bool:
    """`mode`, `x.mode`, `config.get("mode")`: anything that reads a mode."""
    return any(
        (isinstance(part, ast.Name) and part.id == "mode")
        or (isinstance(part, ast.Attribute) and part.attr == "mode")
        or (isinstance(part, ast.Constant) and part.value == "mode")
        for part in ast.walk(node)
    )


def mode_tests(source: str) -> list[int]:
    """Lines that ask `is_buffered` or compare a mode with a mode's name."""
    found = [number for number, line in enumerate(source.splitlines(), 1) if "is_buffered" in line]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(_names_a_mode(side) for side in sides) and any(_reads_a_mode(side) for side in sides):
                found.append(node.lineno)
    return found


def _outside_strategies() -> list[Path]:
    return sorted(path for path in PACKAGE.rglob("*.py") if not path.is_relative_to(STRATEGIES))


@pytest.mark.parametrize("path", _outside_strategies(), ids=lambda path: str(path.relative_to(PACKAGE.parent)))
def test_no_module_outside_the_strategies_asks_which_mode_runs(path: Path) -> None:
    assert mode_tests(path.read_text()) == []


def test_the_check_sees_each_way_of_asking_a_mode() -> None:
    asked = (
        "if config.is_buffered:\n"
        '    pass\nif run.config.get("mode") in ("fedbuff", "fedrevive"):\n'
        '    pass\nif self.mode == "fedrevive":\n'
        '    pass\nok = mode != "fedavg"\n'
    )
    assert mode_tests(asked) == [1, 3, 5, 7]
    # Other fields share the names: a clock, an aggregation, a pack's mode.
    not_asked = 'a = clock == "fedrevive"\nb = aggregate == "fedavg"\nc = task.mode == "vmap"\n'
    assert mode_tests(not_asked) == []


def test_the_registry_holds_one_entry_per_mode_the_config_accepts() -> None:
    assert set(REGISTRY) == set(MODES) == set(config.MODES)
    for name, entry in REGISTRY.items():
        assert entry.mode is MODES[name] and entry.mode.name == name
        run = config.RunConfig(mode=name)
        assert strategy_for(run) is entry.strategy and run.strategy_mode is entry.mode


def test_the_kind_registers_every_strategys_control_tasks_once() -> None:
    names = [handler.name for handler in KIND.handlers]
    assert len(names) == len(set(names))
    for entry in REGISTRY.values():
        assert {handler.name for handler in entry.control} <= set(names)
