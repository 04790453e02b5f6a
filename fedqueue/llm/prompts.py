"""Reading an LLM job's input: a JSONL file of prompts, or a text file with one prompt per line.

A JSONL line is an object with `prompt` (text) or `messages` (a chat, a list of {role, content}),
and an optional `id` (string or integer) that names the prompt in the export. Lines without an id
are named by their line number, so the same file submitted again names every prompt the same.
A bad line (one that is not UTF-8 text included) is an `InputError` naming its line; the job stores it
as a failed row in its place, or, with `strict`, refuses the whole file. With `chat`, a plain prompt is
read as a chat of one user message. Prompts given in Python become the same JSONL. No torch here.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from fedqueue.errors import ConfigError
from fedqueue.llm.messages import KEY_MAX

TEXT_SUFFIXES = (".txt", ".text")  # one prompt per line; anything else is read as JSONL
ROLES = ("system", "user", "assistant", "tool")
ERRORS_SHOWN = 5  # bad lines named in a strict refusal
NOT_UTF8 = "not UTF-8 text"
UNDECODED = re.compile("[\udc80-\udcff]")  # what surrogateescape decodes a byte that is not UTF-8 to
# Byte order marks of UTF-16 and UTF-32 (UTF-32's little-endian mark starts with UTF-16's).
WIDE_BOMS = (b"\xff\xfe", b"\xfe\xff", b"\x00\x00\xfe\xff")


@dataclass(frozen=True)
class PromptLine:
    """One valid input line."""

    key: str  # unique in the job: the line's id, or "line:N"
    input_id: str | int | None  # the id as the input gave it
    line: int  # 1-based line number in the input file
    prompt: str | None = None
    messages: tuple[tuple[str, str], ...] | None = None  # (role, content) pairs

    @property
    def text_key(self) -> str:
        """What the model sees, as one string: equal for prompts that must generate the same output."""
        if self.messages is not None:
            return json.dumps({"messages": [list(pair) for pair in self.messages]}, ensure_ascii=False)
        return json.dumps({"prompt": self.prompt}, ensure_ascii=False)

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.text_key.encode()).hexdigest()

    @property
    def text(self) -> str:
        """The prompt's words, for estimating its length."""
        if self.messages is not None:
            return "\n".join(content for _, content in self.messages)
        return self.prompt or ""


@dataclass(frozen=True)
class InputError:
    """A line that holds no usable prompt."""

    line: int
    input_id: str | int | None
    message: str

    def __str__(self) -> str:
        return f"line {self.line}: {self.message}"


def read_prompt_file(
    path: Path, *, strict: bool = False, chat: bool = False
) -> tuple[list[PromptLine], list[InputError]]:
    """Valid prompts and bad lines of an input file; a file that cannot be read at all is a ConfigError."""
    return read_prompt_bytes(read_input(path), path, strict=strict, chat=chat)


def read_input(path: Path) -> bytes:
    """An input file's bytes; one that cannot be read is a ConfigError naming it."""
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise ConfigError(f"input {path}: no such file") from None
    except IsADirectoryError:
        raise ConfigError(f"input {path}: is a directory, not a file of prompts") from None
    except OSError as error:
        raise ConfigError(f"input {path}: cannot read it ({error.strerror})") from None


def read_prompt_bytes(
    raw: bytes, path: Path, *, strict: bool = False, chat: bool = False
) -> tuple[list[PromptLine], list[InputError]]:
    """Valid prompts and bad lines of an input's bytes; `path` names it (its suffix says whether it is text).

    A line that is not UTF-8 is a bad line like any other; a file with no line of UTF-8 text at all
    (UTF-16 text, a compressed file) is refused whole.
    """
    if raw.startswith(WIDE_BOMS):
        raise ConfigError(f"input {path}: UTF-16 or UTF-32 text (it starts with a byte order mark); save it as UTF-8")
    # Bytes that are not UTF-8 become lone surrogates, which no valid line holds: the lines stay numbered as
    # a text editor numbers them, and each bad one is found and named on its own.
    text = raw.decode("utf-8-sig", errors="surrogateescape")
    plain = path.suffix.lower() in TEXT_SUFFIXES
    prompts, errors = read_prompts(text.splitlines(), plain=plain, strict=strict, chat=chat)
    if not prompts and not errors:
        raise ConfigError(f"input {path}: no prompts in it (every line is blank)")
    if not prompts and all(error.message.startswith(NOT_UTF8) for error in errors):
        raise ConfigError(f"input {path}: {NOT_UTF8} (no line of it decodes as UTF-8); save it as UTF-8")
    if strict and errors:
        shown = "; ".join(str(error) for error in errors[:ERRORS_SHOWN])
        more = f" (and {len(errors) - ERRORS_SHOWN} more)" if len(errors) > ERRORS_SHOWN else ""
        refused = "a bad line" if len(errors) == 1 else f"{len(errors)} bad lines"
        raise ConfigError(f"input {path}: {refused}: {shown}{more}")
    return prompts, errors


def read_prompts(
    lines: Iterable[str], *, plain: bool = False, strict: bool = False, chat: bool = False
) -> tuple[list[PromptLine], list[InputError]]:
    """Parse lines (blank ones skipped); `plain` takes each line as a prompt's text; `chat` makes every
    plain prompt a chat of one user message.

    `strict` stops at the first bad line (returned as the only error); otherwise every line is read.
    """
    prompts: list[PromptLine] = []
    errors: list[InputError] = []
    seen: dict[str, int] = {}  # key -> line that used it
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            _check_decoded(line)
            prompt = PromptLine(key=f"line:{number}", input_id=None, line=number, prompt=line) if plain else None
            if prompt is None:
                prompt = _parse_json_line(line, number)
            if chat and prompt.prompt is not None:
                prompt = replace(prompt, prompt=None, messages=(("user", prompt.prompt),))
            if prompt.key in seen:
                raise _LineError(prompt.input_id, f"id {prompt.input_id!r} was used before, on line {seen[prompt.key]}")
            seen[prompt.key] = number
            prompts.append(prompt)
        except _LineError as error:
            errors.append(InputError(number, error.input_id, error.message))
            if strict:
                break
    return prompts, errors


def prompts_as_jsonl(items: Iterable[object]) -> bytes:
    """Prompts given in Python, as the JSONL file they stand for (item N is line N): a string is
    `{"prompt": ...}`, a dict is a line as it is (prompt or messages, optional id)."""
    if isinstance(items, str | bytes | Mapping):  # iterating these would give characters or keys
        raise ConfigError(f"prompts: expected a path or a list of prompts, got one {type(items).__name__}")
    lines = []
    for index, item in enumerate(items):
        if isinstance(item, str):
            item = {"prompt": item}
        elif not isinstance(item, Mapping):
            raise ConfigError(f"prompts[{index}]: expected a string or a dict, got {type(item).__name__}")
        try:
            lines.append(json.dumps(dict(item), ensure_ascii=False, allow_nan=False))
        except (TypeError, ValueError) as error:
            raise ConfigError(f"prompts[{index}]: not JSON data ({error})") from None
    if not lines:
        raise ConfigError("prompts: empty (give at least one prompt)")
    return "".join(line + "\n" for line in lines).encode()


class _LineError(Exception):
    def __init__(self, input_id: str | int | None, message: str) -> None:
        super().__init__(message)
        self.input_id = input_id
        self.message = message


def _check_decoded(line: str) -> None:
    """A line with bytes that are not UTF-8 (decoded to lone surrogates) is a bad line, naming the first one."""
    found = UNDECODED.search(line)
    if found is not None:
        byte = ord(found.group()) - 0xDC00
        raise _LineError(None, f"{NOT_UTF8} (byte 0x{byte:02x} at column {found.start() + 1}); save the file as UTF-8")


def _parse_json_line(line: str, number: int) -> PromptLine:
    try:
        raw = json.loads(line)
    except json.JSONDecodeError as error:
        # Some of json's messages end in "at" ("Unterminated string starting at"): the column completes them.
        reason = error.msg.removesuffix(" at")
        raise _LineError(None, f"not valid JSON ({reason} at column {error.colno})") from None
    if not isinstance(raw, dict):
        raise _LineError(None, f'expected a JSON object like {{"prompt": "..."}}, got {type(raw).__name__}')
    input_id = _input_id(raw.get("id"))
    unknown = sorted(set(raw) - {"id", "prompt", "messages"})
    if unknown:
        raise _LineError(input_id, f"unknown field {unknown[0]!r} (expected prompt or messages, and id)")
    key = f"line:{number}" if input_id is None else f"id:{input_id}"
    if len(key) > KEY_MAX:
        raise _LineError(None, f"id: longer than {KEY_MAX - 3} characters")
    has_prompt, has_messages = "prompt" in raw, "messages" in raw
    if has_prompt == has_messages:
        raise _LineError(input_id, "give exactly one of prompt or messages")
    if has_prompt:
        if not isinstance(raw["prompt"], str) or not raw["prompt"].strip():
            raise _LineError(input_id, "prompt: must be a non-empty string")
        return PromptLine(key=key, input_id=input_id, line=number, prompt=raw["prompt"])
    return PromptLine(key=key, input_id=input_id, line=number, messages=_messages(raw["messages"], input_id))


def _input_id(value: Any) -> str | int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise _LineError(None, "id: must be a string or an integer")
    if isinstance(value, str) and not value:
        raise _LineError(None, "id: must not be empty")
    return value


def _messages(value: Any, input_id: str | int | None) -> tuple[tuple[str, str], ...]:
    if not isinstance(value, list) or not value:
        raise _LineError(input_id, "messages: must be a non-empty list of {role, content} objects")
    pairs = []
    for index, message in enumerate(value):
        where = f"messages[{index}]"
        if not isinstance(message, dict):
            raise _LineError(input_id, f"{where}: must be an object with role and content")
        role, content = message.get("role"), message.get("content")
        if role not in ROLES:
            raise _LineError(input_id, f"{where}.role: must be one of {', '.join(ROLES)}")
        if not isinstance(content, str):
            raise _LineError(input_id, f"{where}.content: must be a string")
        pairs.append((role, content))
    return tuple(pairs)
