"""Draft, check, refine: a contrastive pair of sentences per topic, kept only once a rule-based validator passes.

    fedqueue llm pipeline examples/pipelines/topics.jsonl --program contrastive:program \
        --plugin-path examples/pipelines --model ./my-model -o pairs.jsonl

Each item is {"id": ..., "topic": ...}, with an optional "max_refines". The model drafts a pair, then checks it;
where the validator still finds a problem, the model refines the pair, up to MAX_REFINES times (or the item's own
"max_refines"). Items take unequal numbers of calls.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

from fedqueue.llm import Generate

MAX_REFINES = 2
MIN_CHARACTERS = 20
SHOWN = 50  # characters of each sentence quoted back to the model: prompts stay short


def program(item: dict[str, Any]) -> Generator[Generate, str, dict[str, Any]]:
    topic = item["topic"]
    draft = yield Generate(prompt=f"Write two opposite sentences about {topic}, one per line.\n", max_new_tokens=48)
    pair = split_pair(draft)
    verdict = yield Generate(
        prompt=f"Do these two sentences disagree?\n{pair[0]}\n{pair[1]}\nAnswer:", max_new_tokens=8
    )
    problems = validate(pair, topic)
    refines, max_refines = 0, int(item.get("max_refines", MAX_REFINES))
    while problems and refines < max_refines:
        refined = yield Generate(
            messages=[
                {"role": "system", "content": "Fix the pair."},
                {"role": "user", "content": f"{', '.join(problems)}:\n{pair[0][:SHOWN]}\n{pair[1][:SHOWN]}"},
            ],
            max_new_tokens=48,
        )
        pair = split_pair(refined)
        problems = validate(pair, topic)
        refines += 1
    return {"topic": topic, "pair": list(pair), "verdict": verdict.strip(), "valid": not problems, "refines": refines}


def split_pair(text: str) -> tuple[str, str]:
    """The first two non-blank lines; a single line is cut at its middle."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if len(lines) >= 2:
        return lines[0], lines[1]
    line = lines[0] if lines else ""
    middle = len(line) // 2
    return line[:middle].strip(), line[middle:].strip()


def validate(pair: tuple[str, str], topic: str) -> list[str]:
    """Rules a usable pair keeps: two sentences of some length each, not the same, not too unequal in length."""
    first, second = pair
    problems = []
    if min(len(first), len(second)) < MIN_CHARACTERS:
        problems.append("too short")
    if first.lower() == second.lower():
        problems.append("the same")
    if min(len(first), len(second)) * 3 < max(len(first), len(second)):
        problems.append("unequal")
    return problems
