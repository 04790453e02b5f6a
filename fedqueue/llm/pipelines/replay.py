"""Advancing an item: its program run from the start, fed the outputs stored for its steps so far.

Programs are deterministic given their outputs, so an item's state is its stored steps: replaying them
gives the request of its next step, its result, or its failure. Pure: no store, no model.
"""

from __future__ import annotations

import json
import traceback
from collections.abc import Generator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from fedqueue.llm.pipelines.program import Program
from fedqueue.llm.pipelines.request import Generate

DEFAULT_MAX_STEPS = 16  # `--max-steps`: most calls one item may make


@dataclass(frozen=True)
class NextCall:
    step: int  # 0-based: how many calls came before it
    request: Generate


@dataclass(frozen=True)
class Finished:
    steps: int
    result: Any  # JSON data


@dataclass(frozen=True)
class Failed:
    steps: int
    error: str  # a traceback, or a sentence where the program broke the protocol


Advance = NextCall | Finished | Failed


def advance(
    program: Program,
    item: Any,
    outputs: Sequence[str],
    max_steps: int = DEFAULT_MAX_STEPS,
    requests: Sequence[Mapping[str, Any]] | None = None,
) -> Advance:
    """What comes after the steps whose `outputs` are given; `requests`, the stored requests of those steps,
    are checked against what the program yields again (a program that does not repeat itself fails)."""
    try:
        generator = program(item)
        if not isinstance(generator, Generator):
            return Failed(0, f"program returned {type(generator).__name__}, not a generator (it must yield)")
        done = 0  # steps fed so far
        yielded: Any = next(generator)
        for output in outputs:
            problem = _check(yielded, done, max_steps, requests)
            if problem is not None:
                return Failed(done, problem)
            done += 1
            yielded = generator.send(output)
    except StopIteration as stop:
        return _finished(done, stop.value)
    except Exception:
        return Failed(done, traceback.format_exc())
    step = len(outputs)
    problem = _check(yielded, step, max_steps, None)
    generator.close()
    return Failed(step, problem) if problem is not None else NextCall(step, yielded)


def _check(yielded: Any, step: int, max_steps: int, requests: Sequence[Mapping[str, Any]] | None) -> str | None:
    if not isinstance(yielded, Generate):
        return f"step {step}: the program yielded {type(yielded).__name__}, not a Generate request"
    if step >= max_steps:
        return f"step {step}: the program asked for more than max_steps ({max_steps}) calls"
    if requests is not None and step < len(requests) and yielded.to_dict() != dict(requests[step]):
        return f"step {step}: replayed, the program asked for another request than the one stored (not deterministic)"
    return None


def _finished(steps: int, result: Any) -> Advance:
    try:
        json.dumps(result, allow_nan=False)
    except (TypeError, ValueError) as error:
        return Failed(steps, f"the program's result is not JSON data ({error})")
    return Finished(steps, result)
