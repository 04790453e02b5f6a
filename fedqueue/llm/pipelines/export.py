"""A pipeline's results: one row per item, in input order, with its result and its whole trace. No torch."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

from fedqueue.llm.export import write_atomically
from fedqueue.llm.pipelines.rows import call_rows, item_rows
from fedqueue.store import Store


def pipeline_rows(store: Store, run_id: str) -> list[dict[str, Any]]:
    """id, line, state (running, done or failed), result, error, steps, and trace: each call's step, request,
    output, tokens and finish reason."""
    traces: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for call in call_rows(store, run_id):
        traces[call.item_key].append(
            {
                "step": call.step,
                "request": call.request,
                "state": call.state,
                "output": call.output,
                "prompt_tokens": call.prompt_tokens,
                "generated_tokens": call.generated_tokens,
                "finish_reason": call.finish_reason,
            }
        )
    return [
        {
            "id": item.line if item.input_id is None else item.input_id,
            "line": item.line,
            "state": item.state,
            "result": item.result,
            "error": item.error,
            "steps": len([call for call in traces[item.key] if call["state"] == "done"]),
            "trace": traces[item.key],
        }
        for item in item_rows(store, run_id)
    ]


def write_pipeline_export(store: Store, run_id: str, out: Path, field: str = "out") -> list[dict[str, Any]]:
    """The items as JSON lines, written whole to `out`; the rows written."""
    rows = pipeline_rows(store, run_id)
    write_atomically(out, "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows), field)
    return rows
