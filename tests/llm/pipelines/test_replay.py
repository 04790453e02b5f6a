"""The program protocol as pure code: requests, loading by import path, and advancing an item by replay."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from fedqueue.errors import ConfigError
from fedqueue.llm.pipelines.program import load_program
from fedqueue.llm.pipelines.replay import Failed, Finished, NextCall, advance
from fedqueue.llm.pipelines.request import Generate, RequestError
from fedqueue.llm.settings import GenerationSettings

PLUGINS = Path(__file__).parents[2] / "support" / "plugin_modules"


@pytest.fixture(autouse=True)
def on_path() -> Iterator[None]:
    sys.path.insert(0, str(PLUGINS))
    yield
    sys.path.remove(str(PLUGINS))


def test_a_request_checks_its_fields_and_stores_what_is_set() -> None:
    chat = Generate(messages=[{"role": "user", "content": "hi"}], max_new_tokens=5)
    assert chat.pairs == (("user", "hi"),)
    assert chat.to_dict() == {"messages": [["user", "hi"]], "max_new_tokens": 5}
    assert Generate.from_dict(chat.to_dict()) == chat
    assert chat.settings(GenerationSettings(max_new_tokens=64, seed=3)) == GenerationSettings(max_new_tokens=5, seed=3)
    for bad, message in [
        ({}, "exactly one of prompt or messages"),
        ({"prompt": ""}, "prompt: must be a non-empty string"),
        ({"prompt": "x", "max_new_tokens": 0}, "Generate.max_new_tokens"),
        ({"messages": [{"role": "robot", "content": "x"}]}, "messages[0]"),
    ]:
        with pytest.raises(RequestError, match=message.replace("[", r"\[")):
            Generate(**bad)  # type: ignore[arg-type]


def test_replay_walks_an_item_through_its_steps_to_its_result() -> None:
    program = load_program("fq_pipelines:refine")
    item = {"topic": "cats"}
    first = advance(program, item, [])
    assert first == NextCall(0, Generate(prompt="Draft cats:"))
    second = advance(program, item, ["abc"])
    assert second == NextCall(1, Generate(prompt="Check abc", max_new_tokens=6))
    third = advance(program, item, ["abc", "ok"])  # an odd draft: a third call
    assert isinstance(third, NextCall) and third.step == 2 and third.request.pairs == (("user", "Refine ok"),)
    assert advance(program, item, ["abc", "ok", "fine"]) == Finished(
        3, {"draft": "abc", "check": "ok", "final": "fine"}
    )
    assert advance(program, item, ["ab", "ok"]) == Finished(2, {"draft": "ab", "check": "ok"})  # even: two calls
    assert advance(load_program("fq_pipelines:returns_early"), item, []) == Finished(0, {"echo": item})


def test_replay_is_checked_against_the_stored_requests() -> None:
    program = load_program("fq_pipelines:refine")
    stored = [{"prompt": "Draft dogs:"}]  # another item's request: the program does not ask it again
    found = advance(program, {"topic": "cats"}, ["abc"], requests=stored)
    assert isinstance(found, Failed) and "not deterministic" in found.error and found.steps == 0
    same = advance(program, {"topic": "cats"}, ["abc"], requests=[{"prompt": "Draft cats:"}])
    assert isinstance(same, NextCall) and same.step == 1


def test_a_program_that_raises_yields_a_non_request_or_loops_fails_its_item() -> None:
    raised = advance(load_program("fq_pipelines:raises"), {"topic": "t", "bad": True}, ["out"])
    assert isinstance(raised, Failed) and raised.steps == 1
    assert "Traceback" in raised.error and "ValueError: no good: 3 characters" in raised.error
    text = advance(load_program("fq_pipelines:yields_text"), {}, [])
    assert text == Failed(0, "step 0: the program yielded str, not a Generate request")
    looped = advance(load_program("fq_pipelines:loops"), {}, ["x"] * 3, max_steps=3)
    assert looped == Failed(3, "step 3: the program asked for more than max_steps (3) calls")
    bad_request = advance(load_program("fq_pipelines:raises"), {}, [])  # item["topic"] missing: a KeyError
    assert isinstance(bad_request, Failed) and "KeyError: 'topic'" in bad_request.error


def test_a_program_that_cannot_be_loaded_is_one_line_naming_the_field() -> None:
    for path, message in [
        ("no_such_module_here:program", "program: cannot import 'no_such_module_here' (ModuleNotFoundError"),
        ("fq_pipelines:missing", "program: module 'fq_pipelines' has no attribute 'missing'"),
        ("fq_pipelines:not_a_generator", "program: fq_pipelines:not_a_generator is not a generator function"),
        ("not a path", "program: 'not a path' is not an import path"),
    ]:
        with pytest.raises(ConfigError) as raised:
            load_program(path)
        assert str(raised.value).startswith(message) and "\n" not in str(raised.value)
