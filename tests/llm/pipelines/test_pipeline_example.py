"""The example pipeline (examples/pipelines/contrastive.py) on the tiny model: each item's trace is the one its
program gives run alone, and the validator's verdict is in every result."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import fedqueue.llm
from fedqueue.config import Settings
from fedqueue.llm.model import load_model
from fedqueue.llm.pipelines.alone import run_alone
from fedqueue.llm.pipelines.program import load_program
from fedqueue.llm.settings import GenerationSettings
from tests.conftest import running_workers

EXAMPLE = Path(__file__).parents[3] / "examples" / "pipelines"


@pytest.mark.slow
def test_the_contrastive_example_runs_on_the_tiny_model_as_each_item_alone(
    settings: Settings, tmp_path: Path, tiny_model_path: Path
) -> None:
    settings = settings.with_plugin_path([str(EXAMPLE)])
    items = [json.loads(line) for line in (EXAMPLE / "topics.jsonl").read_text().splitlines()][:8]
    with running_workers(settings, procs=2, log_dir=tmp_path / "logs"):
        handle = fedqueue.llm.pipeline(items, "contrastive:program", tiny_model_path, settings=settings)
    rows = handle.rows()
    assert [row["id"] for row in rows] == [item["id"] for item in items]
    assert [row["state"] for row in rows] == ["done"] * 8, [row["error"] for row in rows]
    assert all(isinstance(row["result"]["valid"], bool) for row in rows)
    loaded = load_model(str(tiny_model_path))
    program = load_program("contrastive:program")
    for item, row in zip(items, rows, strict=True):
        alone = run_alone(loaded, program, item, GenerationSettings(), f"id:{item['id']}")
        assert [(call["request"], call["output"]) for call in row["trace"]] == alone.steps
        assert row["result"] == alone.result


def test_an_item_sets_its_own_number_of_refines(tiny_model_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(EXAMPLE))
    loaded = load_model(str(tiny_model_path))
    program = load_program("contrastive:program")
    items = [json.loads(line) for line in (EXAMPLE / "topics.jsonl").read_text().splitlines()][:8]
    made = {}
    for refines in (0, None, 6):
        for item in items:
            given = item if refines is None else {**item, "max_refines": refines}
            alone = run_alone(loaded, program, given, GenerationSettings(), f"id:{item['id']}")
            made[(refines, item["id"])] = (len(alone.steps), alone.result["refines"])
    assert all(made[(0, item["id"])] == (2, 0) for item in items)  # a draft and its check only
    for item in items:  # the example's own cap (2) holds where the item sets none; a higher one lets it go on
        calls, refines = made[(None, item["id"])]
        assert calls == 2 + refines and refines <= 2
        assert made[(6, item["id"])][1] >= refines
    assert max(made[(6, item["id"])][1] for item in items) > 2  # some pair still fails after two refines
