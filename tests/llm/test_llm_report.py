"""An LLM job's report speaks of its batches: no rounds, aggregations or updates, in its page or its legend."""

from __future__ import annotations

import re
import time
from pathlib import Path

from fedqueue.core.database import open_store
from fedqueue.report import write_report
from fedqueue.report.plots import timeline_figure
from fedqueue.report.timeline import Lane, Span
from fedqueue.store.repo import TaskTiming

FL_WORDS = re.compile(r"round|aggregat|update|version", re.IGNORECASE)


def batch(index: int, worker: str, start: float) -> TaskTiming:
    return TaskTiming(
        run_id="job1",
        kind="llm",
        task_type="generate",
        task=f"batch {index}",
        round_index=None,
        state="done",
        worker=worker,
        pid=100,
        device_used="cpu",
        attempt=1,
        enqueued_at=start - 0.5,
        started_at=start,
        finished_at=start + 1.0,
        load_ms=200.0 if index < 2 else 0.0,
        compute_ms=800.0,
        upload_ms=0.0,
    )


def test_an_llm_jobs_report_has_no_fl_words(tmp_path: Path) -> None:
    store = open_store(f"sqlite:///{tmp_path / 'jobs.db'}", migrate=True)
    store.create_run("job1", "", {"input": "prompts.jsonl", "model": "/models/m.gguf"}, 0, kind="llm")
    start = time.time() - 10
    for index in range(4):
        store.record_timing(batch(index, f"cpu{index % 2}@host", start + index))
    store.finish_run("job1", "finished")
    write_report(store, "job1", tmp_path / "report")
    store.close()
    html = (tmp_path / "report" / "report.html").read_text()
    text = re.sub(r"<style>.*?</style>|<[^>]+>", " ", html, flags=re.DOTALL)  # what a reader sees, alt text aside
    alts = re.findall(r'alt="([^"]*)"', html)
    assert "generate tasks" in text and "model and data load" in text
    assert FL_WORDS.findall(text) == [] and FL_WORDS.findall(" ".join(alts)) == []


def test_the_timeline_legend_names_only_what_is_drawn() -> None:
    spans = [
        Span(
            task=f"batch {index}",
            round_index=None,
            worker="cpu0@host",
            pid=1,
            device_used="cpu",
            state="done",
            attempt=1,
            enqueued_at=0.0,
            started_at=float(index),
            finished_at=index + 0.9,
            load_ms=0.0,
            compute_ms=900.0,
            upload_ms=0.0,
            task_type="generate",
        )
        for index in range(3)
    ]
    figure = timeline_figure([Lane("cpu0@host", 1, "cpu", 0, tuple(spans))], spans, [], [], 0.0, 3.0)
    labels = [text.get_text() for legend in figure.legends for text in legend.get_texts()]
    assert labels == ["task"]
