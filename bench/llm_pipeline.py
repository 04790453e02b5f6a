"""LLM pipelines: the example program (examples/pipelines/contrastive.py: draft, check, refine while a rule-based
validator finds a problem) over a few hundred items, three ways, on the same model, greedy, float32:

    .venv/bin/python bench/llm_pipeline.py [--items 200] [--model tiny|bench]

  (a) loop     - one process runs each item's program alone, one `generate()` call per request, on one thread
                 (as each worker runs; `--loop-threads` sets another count);
  (b) barrier  - step by step over `fedqueue.llm.run`: every unfinished item's next request in one job per step
                 (one per decoding setting), waiting for the whole step before the next;
  (c) pipeline - `fedqueue.llm.pipeline`: every item's calls batched on the workers, no barrier between steps.
(b) and (c) run on the same local cluster (embedded Redis, one worker per core), warmed up first (the model
loaded in every worker). Items take unequal numbers of calls. Every item's trace (requests and outputs) of (b)
and (c) is compared with (a)'s.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import machine, machine_line, markdown_table, ratio, verdict  # noqa: E402

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "pipelines"
PROGRAM = "contrastive:program"
TARGETS = {"loop": 4.0, "barrier": 1.3}  # (a)/(c) and (b)/(c): at least these
Trace = list[tuple[dict[str, Any], str | None]]


def make_items(count: int, max_refines: int | None) -> list[dict[str, Any]]:
    topics = [json.loads(line)["topic"] for line in (EXAMPLE / "topics.jsonl").read_text().splitlines()]
    items = [{"id": f"item-{n}", "topic": f"{topics[n % len(topics)]} ({n})"} for n in range(count)]
    if max_refines is not None:  # the program's own cap otherwise
        for item in items:
            item["max_refines"] = max_refines
    return items


def way_loop(model_path: Path, items: list[dict[str, Any]], threads: int) -> tuple[float, dict[str, Trace]]:
    import torch

    from fedqueue.llm.model import load_model
    from fedqueue.llm.pipelines.alone import run_alone
    from fedqueue.llm.pipelines.program import load_program
    from fedqueue.llm.settings import GenerationSettings

    loaded = load_model(str(model_path), "float32")
    program = load_program(PROGRAM)
    torch.set_num_threads(threads)
    began = time.perf_counter()
    traces = {
        f"id:{item['id']}": run_alone(
            loaded, program, item, GenerationSettings(dtype="float32"), f"id:{item['id']}"
        ).steps
        for item in items
    }
    return time.perf_counter() - began, traces


def way_barrier(settings: Any, model_path: Path, items: list[dict[str, Any]]) -> tuple[float, dict[str, Trace], int]:
    """Step by step: each step's requests as fedqueue.llm.run jobs, one per decoding setting; jobs in all."""
    import fedqueue.llm
    from fedqueue.llm.pipelines.program import load_program
    from fedqueue.llm.pipelines.replay import NextCall, advance

    program = load_program(PROGRAM)
    traces: dict[str, Trace] = {f"id:{item['id']}": [] for item in items}
    by_key = {f"id:{item['id']}": item for item in items}
    began, jobs, step = time.perf_counter(), 0, 0
    while True:
        requests = {}
        for key, trace in traces.items():
            found = advance(program, by_key[key], [str(output) for _, output in trace])
            if isinstance(found, NextCall):
                requests[key] = found.request
        if not requests:
            return time.perf_counter() - began, traces, jobs
        groups: dict[int | None, list[str]] = {}
        for key, request in requests.items():
            groups.setdefault(request.max_new_tokens, []).append(key)
        for max_new_tokens, keys in groups.items():
            prompts = [_prompt_line(key, requests[key]) for key in keys]
            options = {} if max_new_tokens is None else {"max_new_tokens": max_new_tokens}
            handle = fedqueue.llm.run(
                prompts, model_path, settings=settings, dtype="float32", job=f"barrier-{step}-{jobs}", **options
            )
            jobs += 1
            outputs = {row["id"]: row["output"] for row in handle.rows()}
            for key in keys:
                traces[key].append((requests[key].to_dict(), outputs[key]))
        step += 1


def _prompt_line(key: str, request: Any) -> dict[str, Any]:
    if request.prompt is not None:
        return {"id": key, "prompt": request.prompt}
    return {"id": key, "messages": [{"role": role, "content": content} for role, content in request.pairs]}


def way_pipeline(settings: Any, model_path: Path, items: list[dict[str, Any]]) -> tuple[float, dict[str, Trace], Any]:
    import fedqueue.llm

    began = time.perf_counter()
    handle = fedqueue.llm.pipeline(items, PROGRAM, model_path, settings=settings, dtype="float32", batch_size=32)
    seconds = time.perf_counter() - began
    traces = {f"id:{row['id']}": [(call["request"], call["output"]) for call in row["trace"]] for row in handle.rows()}
    return seconds, traces, handle.status()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--items", type=int, default=200)
    parser.add_argument("--model", choices=("tiny", "bench"), default="tiny")
    parser.add_argument("--loop-threads", type=int, default=1)
    parser.add_argument(
        "--max-refines", type=int, default=None, help="refines an item may make (the example's MAX_REFINES otherwise)"
    )
    args = parser.parse_args()
    import fedqueue
    from fedqueue.config import Settings
    from fedqueue.llm.tiny import build_bench_llama, build_tiny_llama

    sys.path.insert(0, str(EXAMPLE))
    folder = Path(tempfile.mkdtemp(prefix="bench-pipeline-"))
    model_path = (build_bench_llama if args.model == "bench" else build_tiny_llama)(folder / args.model)
    items = make_items(args.items, args.max_refines)
    info = machine()
    print(machine_line(info))

    loop_s, loop_traces = way_loop(model_path, items, args.loop_threads)
    print(f"(a) loop: {loop_s:.1f} s on {args.loop_threads} threads")
    settings = Settings(database_url=f"sqlite:///{folder / 'bench.db'}", key_prefix="bench-pipe")
    with fedqueue.local_cluster(settings=settings, plugin_path=[str(EXAMPLE)]) as cluster:
        procs = len(cluster.workers.specs)
        warm = [{"id": f"warm-{n}", "topic": "warm"} for n in range(4 * procs)]  # every worker loads the model
        fedqueue.llm.pipeline(warm, PROGRAM, model_path, settings=cluster.settings, dtype="float32", batch_size=1)
        pipeline_s, pipeline_traces, status = way_pipeline(cluster.settings, model_path, items)
        print(f"(c) pipeline: {pipeline_s:.1f} s")
        barrier_s, barrier_traces, jobs = way_barrier(cluster.settings, model_path, items)
        print(f"(b) barrier: {barrier_s:.1f} s in {jobs} jobs")

    steps = Counter(len(trace) for trace in loop_traces.values())
    same_pipeline = sum(pipeline_traces[key] == trace for key, trace in loop_traces.items())
    same_barrier = sum(barrier_traces[key] == trace for key, trace in loop_traces.items())
    calls = sum(len(trace) for trace in loop_traces.values())
    print(f"\n{args.items} items, {calls} calls; items by calls made: {dict(sorted(steps.items()))}; {procs} workers")
    print(
        markdown_table(
            ["way", "seconds", "calls/s", "traces equal to (a)", "(c) faster by", "target"],
            [
                [
                    "(a) loop",
                    f"{loop_s:.1f}",
                    f"{calls / loop_s:.1f}",
                    "-",
                    ratio(loop_s, pipeline_s),
                    f">= {TARGETS['loop']}x",
                ],
                [
                    "(b) barrier",
                    f"{barrier_s:.1f}",
                    f"{calls / barrier_s:.1f}",
                    f"{same_barrier}/{len(items)}",
                    ratio(barrier_s, pipeline_s),
                    f">= {TARGETS['barrier']}x",
                ],
                [
                    "(c) pipeline",
                    f"{pipeline_s:.1f}",
                    f"{calls / pipeline_s:.1f}",
                    f"{same_pipeline}/{len(items)}",
                    "-",
                    "-",
                ],
            ],
        )
    )
    ok = loop_s / pipeline_s >= TARGETS["loop"] and barrier_s / pipeline_s >= TARGETS["barrier"]
    print(f"pipeline status: {status['done']} done, {status['failed']} failed, {status['calls']} calls")
    print(verdict(ok and same_pipeline == same_barrier == len(items)))


if __name__ == "__main__":
    main()
