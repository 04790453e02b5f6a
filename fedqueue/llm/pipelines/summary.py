"""What a pipeline did, from the store: items by state, calls made, tokens, the first failures. No torch."""

from __future__ import annotations

from typing import Any

from fedqueue.llm.pipelines.rows import item_rows, pipeline_counts
from fedqueue.store import Store

ERRORS_SHOWN = 5


def pipeline_summary(store: Store, run_id: str) -> dict[str, Any]:
    run = store.get_run(run_id)
    counts = pipeline_counts(store, run_id)
    end = run.finished_at
    wall_s = None if end is None else round(max(0.0, end - run.created_at), 3)
    failed = [row for row in item_rows(store, run_id) if row.state == "failed"]
    return {
        "id": run.id,
        "kind": run.kind,
        "state": run.state,
        "error": run.error,
        "program": run.config.get("program"),
        "model": run.config.get("model"),
        "generation": run.config.get("generation"),
        "items": counts.get("total", 0),
        "done": counts.get("done", 0),
        "failed": counts.get("failed", 0),
        "running": counts.get("running", 0),
        "calls": counts.get("calls", 0),
        "prompt_tokens": counts.get("prompt_tokens", 0),
        "generated_tokens": counts.get("generated_tokens", 0),
        "wall_s": wall_s,
        "errors": [
            {"line": row.line, "id": row.input_id, "error": ((row.error or "").strip().splitlines() or [""])[-1]}
            for row in failed[:ERRORS_SHOWN]
        ],
    }


def summary_line(summary: dict[str, Any]) -> str:
    wall = "" if summary["wall_s"] is None else f" in {summary['wall_s']:.1f} s"
    return (
        f"pipeline {summary['id']} ({summary['state']}): {summary['done']} done, {summary['failed']} failed, "
        f"{summary['running']} running of {summary['items']} items · {summary['calls']} calls, "
        f"{summary['generated_tokens']} tokens generated{wall}"
    )
