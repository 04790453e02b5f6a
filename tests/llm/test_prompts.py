"""Reading a job's input file: valid lines, bad lines named by number, strict refusal."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fedqueue.errors import ConfigError
from fedqueue.llm.prompts import PromptLine, read_prompt_file, read_prompts


def write_lines(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_prompts_and_chats_keep_ids_and_line_numbers() -> None:
    lines = [
        json.dumps({"id": "a", "prompt": "Hello"}),
        "",
        json.dumps({"prompt": "No id here"}),
        json.dumps({"id": 7, "messages": [{"role": "user", "content": "Hi"}]}),
    ]
    prompts, errors = read_prompts(lines)
    assert errors == []
    assert [(p.key, p.input_id, p.line) for p in prompts] == [("id:a", "a", 1), ("line:3", None, 3), ("id:7", 7, 4)]
    assert prompts[2].messages == (("user", "Hi"),)
    assert prompts[0].prompt == "Hello" and prompts[0].messages is None


@pytest.mark.parametrize(
    ("line", "fragment"),
    [
        ("{not json", "not valid JSON"),
        ("[1, 2]", "expected a JSON object"),
        (json.dumps({"id": "x"}), "exactly one of prompt or messages"),
        (json.dumps({"prompt": "a", "messages": []}), "exactly one of prompt or messages"),
        (json.dumps({"prompt": ""}), "prompt: must be a non-empty string"),
        (json.dumps({"prompt": 3}), "prompt: must be a non-empty string"),
        (json.dumps({"prompt": "a", "temperature": 1}), "unknown field 'temperature'"),
        (json.dumps({"id": [1], "prompt": "a"}), "id: must be a string or an integer"),
        (json.dumps({"id": True, "prompt": "a"}), "id: must be a string or an integer"),
        (json.dumps({"id": "x" * 400, "prompt": "a"}), "id: longer than"),
        (json.dumps({"messages": [{"role": "robot", "content": "a"}]}), "messages[0].role"),
        (json.dumps({"messages": [{"role": "user", "content": 5}]}), "messages[0].content"),
        (json.dumps({"messages": "hi"}), "messages: must be a non-empty list"),
    ],
)
def test_a_bad_line_is_an_error_naming_its_line(line: str, fragment: str) -> None:
    good = json.dumps({"prompt": "fine"})
    prompts, errors = read_prompts([good, line, good.replace("fine", "also fine")])
    assert [p.line for p in prompts] == [1, 3]  # the lines around it are still read
    assert len(errors) == 1 and errors[0].line == 2
    assert fragment in errors[0].message
    assert str(errors[0]).startswith("line 2: ")


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('{"prompt": "no end', "not valid JSON (Unterminated string starting at column 12)"),
        ('{"prompt": "a"', "not valid JSON (Expecting ',' delimiter at column 15)"),
        ('{"prompt": "tab\there"}', "not valid JSON (Invalid control character at column 16)"),
    ],
)
def test_a_line_that_is_not_json_names_its_column_once(line: str, message: str) -> None:
    _, errors = read_prompts([line])
    assert [error.message for error in errors] == [message]


def test_a_repeated_id_is_an_error_on_the_later_line() -> None:
    lines = [json.dumps({"id": "q", "prompt": "one"}), json.dumps({"id": "q", "prompt": "two"})]
    prompts, errors = read_prompts(lines)
    assert [p.line for p in prompts] == [1]
    assert errors[0].line == 2 and "used before, on line 1" in errors[0].message and errors[0].input_id == "q"


def test_text_files_take_each_line_as_a_prompt(tmp_path: Path) -> None:
    path = write_lines(tmp_path / "prompts.txt", ["first {not json}", "", "second"])
    prompts, errors = read_prompt_file(path)
    assert errors == [] and [(p.key, p.prompt) for p in prompts] == [
        ("line:1", "first {not json}"),
        ("line:3", "second"),
    ]


def test_strict_refuses_the_file_naming_the_bad_lines(tmp_path: Path) -> None:
    path = write_lines(tmp_path / "in.jsonl", [json.dumps({"prompt": "ok"}), "oops", json.dumps({"prompt": "ok2"})])
    with pytest.raises(ConfigError, match=r"line 2: not valid JSON"):
        read_prompt_file(path, strict=True)
    prompts, errors = read_prompt_file(path)
    assert len(prompts) == 2 and [e.line for e in errors] == [2]


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        (None, "no such file"),
        (b"\n  \n", "no prompts in it"),
        ('{"prompt": "a"}\n'.encode("utf-16"), "UTF-16 or UTF-32 text"),
        (b"\x1f\x8b\x08\x00\xa5\n\xff\xfe\n", "not UTF-8 text"),  # no line of it decodes
    ],
)
def test_an_unreadable_file_is_a_config_error(tmp_path: Path, content: bytes | None, fragment: str) -> None:
    path = tmp_path / "in.jsonl"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(ConfigError, match=fragment):
        read_prompt_file(path)


def test_equal_prompts_share_a_text_key_and_digest() -> None:
    a = PromptLine("line:1", None, 1, prompt="same")
    b = PromptLine("id:x", "x", 2, prompt="same")
    chat = PromptLine("line:3", None, 3, messages=(("user", "same"),))
    assert a.text_key == b.text_key and a.sha256 == b.sha256
    assert chat.sha256 != a.sha256  # a chat is rendered by a template: not the same input as plain text


def test_a_line_that_is_not_utf8_is_one_bad_line_unless_strict(tmp_path: Path) -> None:
    path = tmp_path / "in.jsonl"
    path.write_bytes(b'{"prompt": "caf\xc3\xa9"}\n{"prompt": "caf\xe9"}\n\n{"id": 3, "prompt": "ok"}\n')
    prompts, errors = read_prompt_file(path)
    assert [(p.line, p.prompt) for p in prompts] == [(1, "café"), (4, "ok")]
    assert [str(error) for error in errors] == [
        "line 2: not UTF-8 text (byte 0xe9 at column 16); save the file as UTF-8"
    ]
    with pytest.raises(ConfigError, match=r"^input .*in\.jsonl: a bad line: line 2: not UTF-8 text \(byte 0xe9"):
        read_prompt_file(path, strict=True)


def test_chat_reads_plain_prompts_as_a_user_message(tmp_path: Path) -> None:
    lines = [json.dumps({"id": "a", "prompt": "Hi"}), json.dumps({"messages": [{"role": "system", "content": "S"}]})]
    prompts, _ = read_prompts(lines, chat=True)
    assert [(p.prompt, p.messages) for p in prompts] == [(None, (("user", "Hi"),)), (None, (("system", "S"),))]
    text = write_lines(tmp_path / "in.txt", ["What is the capital of France?"])
    [prompt], _ = read_prompt_file(text, chat=True)
    assert prompt.messages == (("user", "What is the capital of France?"),) and prompt.key == "line:1"
