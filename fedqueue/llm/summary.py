"""What an LLM job did, from the store: prompts by state, tokens, speed per worker, padding. No torch."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from fedqueue.llm.results import batch_timings, job_counts, prompt_rows
from fedqueue.llm.schema import LlmPromptRow
from fedqueue.store import Store

ERRORS_SHOWN = 5


def job_summary(store: Store, run_id: str) -> dict[str, Any]:
    run = store.get_run(run_id)
    counts = job_counts(store, run_id)
    rows = prompt_rows(store, run_id)
    timings = batch_timings(store, run_id)
    ran = [timing for timing in timings if timing.state == "done"]
    end = run.finished_at or max((timing.finished_at for timing in timings), default=run.created_at)
    wall_s = max(0.0, end - run.created_at)
    busy: dict[str, float] = defaultdict(float)
    for timing in ran:
        busy[f"{timing.worker}:{timing.pid}"] += timing.finished_at - timing.started_at
    generated = counts.get("generated_tokens", 0)
    return {
        "id": run.id,
        "kind": run.kind,
        "name": run.name,
        "state": run.state,
        "error": run.error,
        "model": run.config.get("model"),
        "generation": run.config.get("generation"),
        "prompts": counts.get("total", 0),
        "done": counts.get("done", 0),
        "failed": counts.get("failed", 0),
        "pending": counts.get("pending", 0),
        "prompt_tokens": counts.get("prompt_tokens", 0),
        "generated_tokens": generated,
        "wall_s": round(wall_s, 3),
        "tokens_per_s": round(generated / wall_s, 2) if wall_s > 0 else None,
        "batches_done": len(ran),
        "pad_fraction": pad_fraction(rows),
        "workers": [
            {"worker": worker, "busy_s": round(seconds, 3), "tokens_per_s": _rate(rows, worker, seconds)}
            for worker, seconds in sorted(busy.items())
        ],
        "errors": [
            {"line": row.line, "id": row.input_id, "error": ((row.error or "").strip().splitlines() or [""])[-1]}
            for row in rows
            if row.state == "failed"
        ][:ERRORS_SHOWN],
    }


def pad_fraction(rows: list[LlmPromptRow]) -> float | None:
    """Share of the prompt positions that were padding, over the batches as planned (left padding)."""
    by_batch: dict[int, list[int]] = defaultdict(list)
    for row in rows:
        if row.state == "done" and row.batch is not None and row.prompt_tokens is not None and row.same_as is None:
            by_batch[row.batch].append(row.prompt_tokens)
    padded = sum(len(tokens) * max(tokens) for tokens in by_batch.values())
    return None if padded == 0 else round(1 - sum(sum(tokens) for tokens in by_batch.values()) / padded, 4)


def _rate(rows: list[LlmPromptRow], worker_pid: str, busy_s: float) -> float | None:
    worker = worker_pid.rsplit(":", 1)[0]
    tokens = sum(row.generated_tokens or 0 for row in rows if row.worker == worker and row.same_as is None)
    return round(tokens / busy_s, 2) if busy_s > 0 else None
