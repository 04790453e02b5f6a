"""`fedqueue.llm.pipeline(...)` from Python: items as a list, bad programs' items failed and the others done."""

from __future__ import annotations

from pathlib import Path

import pytest

import fedqueue.llm
from fedqueue.config import Settings
from fedqueue.errors import ConfigError
from fedqueue.llm.pipelines.rows import call_rows
from fedqueue.report import write_report
from tests.conftest import running_workers
from tests.support.reliability_support import PLUGINS


def test_items_that_loop_yield_text_or_raise_fail_and_the_others_go_on(
    settings: Settings, tmp_path: Path, tiny_model_path: Path
) -> None:
    settings = settings.with_plugin_path([str(PLUGINS)])
    items = [{"id": f"i{n}", "do": do} for n, do in enumerate(["ok", "loop", "ok", "text", "raise", "ok"])]
    with running_workers(settings, procs=2, log_dir=tmp_path / "logs"):
        handle = fedqueue.llm.pipeline(items, "fq_pipelines:mixed", tiny_model_path, settings=settings, max_steps=3)
        again = fedqueue.llm.pipeline(items, "fq_pipelines:mixed", tiny_model_path, settings=settings, max_steps=3)
    rows = {row["id"]: row for row in handle.rows()}
    assert [rows[f"i{n}"]["state"] for n in range(6)] == ["done", "failed", "done", "failed", "failed", "done"]
    assert rows["i1"]["error"] == "step 3: the program asked for more than max_steps (3) calls"
    assert rows["i1"]["steps"] == 3
    assert rows["i3"]["error"] == "step 0: the program yielded str, not a Generate request"
    assert rows["i4"]["error"].rstrip().endswith("RuntimeError: asked to") and "Traceback" in rows["i4"]["error"]
    assert rows["i0"]["result"] == {"answer": rows["i0"]["trace"][0]["output"]}
    progress = handle.progress()
    assert (progress["done"], progress["failed"], progress["total"], progress["calls"]) == (3, 3, 6, 7)
    # The same items again continue the pipeline: it was finished, so nothing is generated again.
    assert again.id == handle.id and again.submitted is not None and again.submitted.resumed
    assert again.submitted.running == 0 and again.rows() == handle.rows()
    assert len(call_rows(handle.store, handle.id)) == 7
    # The report shows the pipeline's own numbers.
    report = write_report(handle.store, handle.id, tmp_path / "report")
    assert (report["job"]["items"], report["job"]["done"], report["job"]["calls"]) == (6, 3, 7)


def test_a_program_that_does_not_import_is_refused_before_anything_starts(
    tmp_path: Path, tiny_model_path: Path
) -> None:
    local = Settings(database_url=f"sqlite:///{tmp_path / 'store.db'}")
    with pytest.raises(ConfigError, match=r"^program: cannot import 'nowhere_at_all' \(ModuleNotFoundError"):
        fedqueue.llm.pipeline([{"a": 1}], "nowhere_at_all:program", tiny_model_path, settings=local)
    with pytest.raises(ConfigError, match="^max_stepz: unknown option"):
        fedqueue.llm.pipeline([{"a": 1}], "fq_pipelines:refine", tiny_model_path, settings=local, max_stepz=2)
    assert not (tmp_path / "store.db").exists()
