"""The question a Ctrl-C on `fedqueue run` asks: a second Ctrl-C is "no answer" wherever it lands, even in the
moment between the question showing and the read beginning (the whole command is tested on a terminal in
test_cancel.py)."""

from __future__ import annotations

import io
from typing import Any

import pytest

from fedqueue.cli import launch
from fedqueue.cli.common import error_console


@pytest.fixture
def on_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(launch, "_interactive", lambda: True)


def _interrupt(*args: Any, **kwargs: Any) -> Any:
    raise KeyboardInterrupt


@pytest.mark.usefixtures("on_a_terminal")
@pytest.mark.parametrize(("typed", "answer"), [("y\n", True), ("yes\n", True), ("\n", False), ("", None)])
def test_the_answer_typed(monkeypatch: pytest.MonkeyPatch, typed: str, answer: bool | None) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO(typed))
    assert launch._ask("cancel? ") is answer


@pytest.mark.usefixtures("on_a_terminal")
def test_a_ctrl_c_while_the_question_is_written_is_no_answer(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO("y\n"))  # never read: the interrupt came first
    printed: list[str] = []

    def question_then_interrupt(*args: Any, **kwargs: Any) -> None:
        if not printed:
            printed.append(str(args[0]))
            raise KeyboardInterrupt  # the signal landing as the question's write returns

    monkeypatch.setattr(error_console, "print", question_then_interrupt)
    assert launch._ask("cancel? ") is None
    assert printed == ["cancel? "]


@pytest.mark.usefixtures("on_a_terminal")
def test_a_ctrl_c_while_reading_is_no_answer(monkeypatch: pytest.MonkeyPatch) -> None:
    stdin = io.StringIO("y\n")
    monkeypatch.setattr(stdin, "readline", _interrupt)
    monkeypatch.setattr("sys.stdin", stdin)
    assert launch._ask("cancel? ") is None
