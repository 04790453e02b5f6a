"""Pipeline programs for the tests: imported by path in the test process and in worker processes alike."""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

from fedqueue.llm import Generate

Program = Generator[Any, str, Any]


def refine(item: dict[str, Any]) -> Program:
    """Draft, check, refine: two or three calls, as the draft's length decides (items take unequal steps)."""
    draft = yield Generate(prompt=f"Draft {item['topic']}:")
    check = yield Generate(prompt=f"Check {draft[:20]}", max_new_tokens=6)
    if len(draft) % 2 == 0:
        return {"draft": draft, "check": check}
    final = yield Generate(messages=[{"role": "user", "content": f"Refine {check[:10]}"}])
    return {"draft": draft, "check": check, "final": final}


def raises(item: dict[str, Any]) -> Program:
    output = yield Generate(prompt=f"Start {item['topic']}")
    if item.get("bad"):
        raise ValueError(f"no good: {len(output)} characters")
    return output


def yields_text(item: dict[str, Any]) -> Program:
    yield "not a request"
    return None


def loops(item: dict[str, Any]) -> Program:
    output = ""
    while True:
        output = yield Generate(prompt=f"Again {output[:8]}")


def returns_early(item: dict[str, Any]) -> Program:
    if False:
        yield Generate(prompt="never")
    return {"echo": item}


def not_a_generator(item: dict[str, Any]) -> str:
    return "plain"


def mixed(item: dict[str, Any]) -> Program:
    """What item["do"] says: loop forever, yield text, raise, or answer in one call."""
    if item["do"] == "loop":
        yield from loops(item)
    if item["do"] == "text":
        yield from yields_text(item)
    output = yield Generate(prompt=f"Answer {item['id']}", max_new_tokens=4)
    if item["do"] == "raise":
        raise RuntimeError("asked to")
    return {"answer": output}
