"""LLM batch inference: a for-loop of generate() calls against a fedqueue job on the same machine.

    .venv/bin/python bench/llm_batch.py [--prompts 96] [--new-tokens 32] [--models tiny bench]

The same prompts (varied lengths) on the same model, greedy, float32:
  (a) loop     - one process calls `model.generate()` once per prompt, as a batch script would
                 (torch's default thread count: every core);
  (b) fedqueue - `fedqueue llm` through the embedded Redis and one worker process per core
                 (one thread each), timed from submit to the last stored row, with the workers
                 already running and the model loaded (a warm-up job loads it in every worker).
The cold start (cluster up, first model load) is reported apart. Outputs of (b) are compared
with (a) prompt by prompt. Models: "tiny" (2 layers, 64 wide) and "bench" (~25M: 8 layers, 512 wide).

End to end, as a user times it (a second table), each from the command's start to its exported file:
  loop command  - `python` running the loop above as a script: imports, model load, loop, JSONL written;
  fedqueue warm - `fedqueue llm submit ... -o out.jsonl` on a broker whose workers are up with the
                  model loaded (FEDQUEUE_BROKER_URL set), batches planned for the slots that answer;
  fedqueue cold - the same command with nothing running: it starts the embedded Redis and the workers,
                  which load the model, and stops them after the export.

A second table decides the generation strategy, in one process with every core: fedqueue's sorted
static batches (what a worker runs) against transformers' continuous batching (`generate_batch`).

With --vllm (run by the vLLM venv's Python: `make bench-vllm`), vLLM instead, 512 prompts x 64 new tokens:
  bare vLLM     - a script calling vLLM's offline `LLM.generate` on every prompt at once in one process, timed
                  from its start to its written file (start-up included) and for `generate` alone (excluded);
                  one untimed run before fills vLLM's compile cache, as any earlier run on the machine would;
  fedqueue+vLLM - `fedqueue llm submit --backend vllm -o` on 2 and on 1 worker: with the workers up and their
                  engines started (a warm-up job first), and with nothing running (the command starts Redis and
                  the workers, each worker its engine).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import ForeignLoad, machine, machine_line, markdown_table, ratio, verdict, wait_for_quiet  # noqa: E402

TARGETS = {"tiny": 4.0, "bench": 2.5}  # (b)/(a) on a 2-core machine
# fedqueue+vLLM end to end against bare vLLM's end to end (start-up included), by worker count: at least these.
VLLM_TARGETS = {2: 1.5, 1: 1 / 1.1}
COMMAND_TARGETS = {"tiny": 4.0, "bench": 3.0}  # loop command / fedqueue command with the workers up
WORDS = "the a of to model queue worker batch token prompt answer question why how long short".split()  # noqa: SIM905


def make_prompts(count: int, seed: int = 0) -> list[str]:
    """Prompts of 2 to 30 words (at most ~200 characters: the tiny model reads 256), in no particular order."""
    generator = random.Random(seed)
    return [" ".join(generator.choice(WORDS) for _ in range(generator.randint(2, 30))) for _ in range(count)]


def build_model(kind: str, folder: Path, heads: int = 4) -> Path:
    from fedqueue.llm.tiny import build_bench_llama, build_tiny_llama

    path = folder / kind
    return build_bench_llama(path) if kind == "bench" else build_tiny_llama(path, heads=heads)


def way_loop(model_path: Path, prompts: list[str], new_tokens: int) -> tuple[float, list[str], int]:
    """(a): generate() per prompt; seconds, outputs, generated tokens."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_path)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
    outputs, generated = [], 0
    began = time.perf_counter()
    with torch.inference_mode():
        for prompt in prompts:
            inputs = tokenizer(prompt, return_tensors="pt")
            ids = model.generate(
                **inputs, max_new_tokens=new_tokens, do_sample=False, pad_token_id=tokenizer.pad_token_id
            )[0, inputs["input_ids"].shape[1] :]
            generated += len(ids)
            outputs.append(tokenizer.decode(ids, skip_special_tokens=True))
    return time.perf_counter() - began, outputs, generated


LOOP_SCRIPT = """
import json, sys
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

model_path, input_path, output_path, new_tokens = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
tokenizer = AutoTokenizer.from_pretrained(model_path)
model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
rows = [json.loads(line) for line in open(input_path)]
with open(output_path, "w") as out, torch.inference_mode():
    for row in rows:
        inputs = tokenizer(row["prompt"], return_tensors="pt")
        ids = model.generate(
            **inputs, max_new_tokens=new_tokens, do_sample=False, pad_token_id=tokenizer.pad_token_id
        )[0, inputs["input_ids"].shape[1] :]
        out.write(json.dumps({"id": row["id"], "output": tokenizer.decode(ids, skip_special_tokens=True)}) + "\\n")
"""


def way_loop_command(model_path: Path, input_path: Path, new_tokens: int, folder: Path) -> tuple[float, list[str]]:
    """The loop as a script a user runs: seconds from its start to the written file, and its outputs."""
    script, output = folder / "loop.py", folder / f"loop-{model_path.name}.jsonl"
    script.write_text(LOOP_SCRIPT)
    command = [sys.executable, str(script), str(model_path), str(input_path), str(output), str(new_tokens)]
    began = time.perf_counter()
    subprocess.run(command, check=True, capture_output=True)
    seconds = time.perf_counter() - began
    return seconds, [json.loads(line)["output"] for line in output.read_text().splitlines()]


def way_command(
    model_path: Path, input_path: Path, new_tokens: int, env: dict[str, str], output: Path, extra: list[str]
) -> tuple[float, list[str], str]:
    """`fedqueue llm submit ... -o FILE`: seconds from its start to its exit (the file written), outputs, stdout."""
    command = [
        str(Path(sys.executable).with_name("fedqueue")),
        "llm",
        "submit",
        str(input_path),
        "--model",
        str(model_path),
        "--max-new-tokens",
        str(new_tokens),
        "--dtype",
        "float32",
        "-o",
        str(output),
        *extra,
    ]
    began = time.perf_counter()
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - began
    if done.returncode != 0:
        raise RuntimeError(f"fedqueue llm submit failed ({done.returncode}): {done.stderr[-2000:]}")
    return seconds, [json.loads(line)["output"] or "" for line in output.read_text().splitlines()], done.stdout


def batches_line(stdout: str) -> str:
    """The command's own line on how it planned the job ("... in 10 batches for 2 worker slots")."""
    return next((line.split(": ", 1)[-1] for line in stdout.splitlines() if "worker slots" in line), "?")


def way_fedqueue(model_path: Path, input_path: Path, new_tokens: int, batch_size: int, folder: Path) -> dict[str, Any]:
    """(b) and the warm command: a warm cluster; seconds, outputs in input order, pad fraction, the cold start."""
    import fedqueue
    from fedqueue.config import Settings
    from fedqueue.llm.job import JobRequest, submit_job
    from fedqueue.llm.results import prompt_rows
    from fedqueue.llm.settings import GenerationSettings
    from fedqueue.llm.summary import job_summary
    from fedqueue.queue.client import open_client_services

    settings = Settings(database_url=f"sqlite:///{folder / f'llm-{model_path.name}.db'}", key_prefix="bench-llm")
    generation = GenerationSettings(max_new_tokens=new_tokens, dtype="float32")
    cold = time.perf_counter()
    with fedqueue.local_cluster(settings=settings) as cluster:
        services = open_client_services(cluster.settings)
        procs = len(cluster.workers.specs)
        # Warm-up: one-prompt batches until every worker has loaded the model.
        warm_input = folder / "warm.jsonl"
        warm_input.write_text("".join(json.dumps({"prompt": f"warm {i}"}) + "\n" for i in range(4 * procs)))
        warm = submit_job(services, JobRequest(warm_input, str(model_path), generation, batch_size=1))
        _wait(services, warm.job_id)
        cold_s = time.perf_counter() - cold
        loads = [t for t in services.store.task_timings(warm.job_id) if t.load_ms > 100]
        loaded_by = {t.worker for t in services.store.task_timings(warm.job_id)}
        if len(loaded_by) < procs:
            print(f"WARNING: only {len(loaded_by)} of {procs} workers took a warm-up batch")

        slots = sum(spec.slots for spec in cluster.workers.specs)
        request = JobRequest(input_path, str(model_path), generation, batch_size=batch_size, slots=slots)
        began = time.perf_counter()
        submitted = submit_job(services, request)
        _wait(services, submitted.job_id)
        seconds = time.perf_counter() - began
        rows = prompt_rows(services.store, submitted.job_id)
        summary = job_summary(services.store, submitted.job_id)
        services.close()
        # End to end with the workers up and the model loaded: the command as a user runs it.
        env = {**os.environ, **cluster.settings.to_env()}
        output = folder / f"warm-{model_path.name}.jsonl"
        # Its own job name: the same input and settings would otherwise continue (b)'s finished job.
        extra = ["--job", f"e2e-{model_path.name}"]
        warm_s, warm_outputs, warm_stdout = way_command(model_path, input_path, new_tokens, env, output, extra)
    return {
        "seconds": seconds,
        "outputs": [row.output or "" for row in rows],
        "generated": summary["generated_tokens"],
        "pad_fraction": summary["pad_fraction"],
        "batches": len(submitted.batches),
        "procs": procs,
        "cold_s": cold_s,
        "model_load_s": max((t.load_ms for t in loads), default=0.0) / 1000,
        "command_s": warm_s,
        "command_outputs": warm_outputs,
        "command_plan": batches_line(warm_stdout),
    }


def way_cold_command(
    model_path: Path,
    input_path: Path,
    new_tokens: int,
    folder: Path,
    extra: list[str] | None = None,
    tag: str = "",
    threads: int = 1,
) -> tuple[float, list[str]]:
    """`fedqueue llm submit -o` with nothing running: embedded Redis and one worker per core start and stop."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("FEDQUEUE_")}
    env["FEDQUEUE_THREADS_PER_TASK"] = str(threads)
    env["FEDQUEUE_DATABASE_URL"] = f"sqlite:///{folder / f'cold-{model_path.name}{tag}.db'}"
    output = folder / f"cold-{model_path.name}{tag}.jsonl"
    seconds, outputs, _ = way_command(model_path, input_path, new_tokens, env, output, extra or [])
    return seconds, outputs


VLLM_SCRIPT = """
import json, sys, time

began = time.perf_counter()
from vllm import LLM, SamplingParams

if __name__ == "__main__":
    model, input_path, output_path, new_tokens = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    rows = [json.loads(line) for line in open(input_path)]
    # vLLM's CPU default reserves 92 % of the machine's memory for the KV cache: more than is free beside other work.
    llm = LLM(model=model, dtype="float32", seed=0, kv_cache_memory_bytes=1 << 30)
    started = time.perf_counter()
    params = SamplingParams(temperature=0.0, max_tokens=new_tokens)
    outputs = llm.generate([row["prompt"] for row in rows], params, use_tqdm=False)
    generated = time.perf_counter()
    with open(output_path, "w") as out:
        for row, output in zip(rows, outputs):
            out.write(json.dumps({"id": row["id"], "output": output.outputs[0].text}) + "\\n")
    tokens = sum(len(output.outputs[0].token_ids) for output in outputs)
    print("TIMES " + json.dumps({"startup_s": started - began, "generate_s": generated - started, "tokens": tokens}))
"""


def way_vllm_offline(model_path: Path, input_path: Path, new_tokens: int, folder: Path) -> dict[str, Any]:
    """Bare vLLM as a user's script: seconds from its start to the written file, start-up and generate() apart."""
    script, output = folder / "vllm_offline.py", folder / f"vllm-{model_path.name}.jsonl"
    script.write_text(VLLM_SCRIPT)
    command = [sys.executable, str(script), str(model_path), str(input_path), str(output), str(new_tokens)]
    began = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True)
    seconds = time.perf_counter() - began
    if done.returncode != 0:
        raise RuntimeError(f"bare vLLM failed ({done.returncode}): {done.stderr[-2000:]}")
    # vLLM logs to stdout as well: the script's own line is marked.
    inside = json.loads(next(line for line in done.stdout.splitlines() if line.startswith("TIMES "))[6:])
    outputs = [json.loads(line)["output"] for line in output.read_text().splitlines()]
    return {"command_s": seconds, "outputs": outputs, **inside}


def way_fedqueue_vllm(
    model_path: Path, input_path: Path, new_tokens: int, procs: int, batch_size: int, folder: Path
) -> dict[str, Any]:
    """`fedqueue llm submit --backend vllm -o` on `procs` workers whose engines are up; seconds, outputs, start-up."""
    import fedqueue
    from fedqueue.config import Settings
    from fedqueue.llm.job import JobRequest, submit_job
    from fedqueue.llm.settings import GenerationSettings
    from fedqueue.queue.client import open_client_services

    tag = f"{model_path.name}-{procs}"
    settings = Settings(
        database_url=f"sqlite:///{folder / f'vllm-{tag}.db'}",
        key_prefix=f"bench-vllm-{procs}",
        threads_per_task=vllm_threads(procs),
    )
    generation = GenerationSettings(max_new_tokens=new_tokens, dtype="float32", backend="vllm")
    cold = time.perf_counter()
    with fedqueue.local_cluster(procs, settings=settings) as cluster:
        services = open_client_services(cluster.settings)
        # Warm-up: one-prompt batches until every worker has started its engine.
        warm_input = folder / f"warm-vllm-{tag}.jsonl"
        warm_input.write_text("".join(json.dumps({"prompt": f"warm {i}"}) + "\n" for i in range(2 * procs)))
        warm = submit_job(services, JobRequest(warm_input, str(model_path), generation, batch_size=1, slots=procs))
        _wait(services, warm.job_id)
        cold_s = time.perf_counter() - cold
        timings = services.store.task_timings(warm.job_id)
        if len({t.worker for t in timings}) < procs:
            print(f"WARNING: only {len({t.worker for t in timings})} of {procs} workers took a warm-up batch")
        engine_s = max((t.load_ms for t in timings), default=0.0) / 1000
        services.close()
        env = {**os.environ, **cluster.settings.to_env()}
        extra = ["--backend", "vllm", "--batch-size", str(batch_size), "--job", f"e2e-vllm-{procs}"]
        output = folder / f"warm-vllm-{tag}.jsonl"
        seconds, outputs, stdout = way_command(model_path, input_path, new_tokens, env, output, extra)
    return {
        "command_s": seconds,
        "outputs": outputs,
        "cold_s": cold_s,
        "engine_s": engine_s,
        "plan": batches_line(stdout),
    }


def vllm_threads(procs: int) -> int:
    """Each worker's threads: the cores shared out (bare vLLM uses every core too: one computes, one serves)."""
    return max(1, (os.cpu_count() or 1) // procs)


def vllm_main(args: argparse.Namespace) -> None:
    """fedqueue with the vLLM backend on 2 and 1 workers against bare vLLM offline in one process."""
    info = machine()
    print(machine_line(info))
    import vllm

    prompts = make_prompts(args.prompts)
    rows, notes = [], []
    load = ForeignLoad()
    with tempfile.TemporaryDirectory(prefix="fedqueue-bench-vllm-") as name:
        folder = Path(name)
        # Every engine of this run shares one compile cache, filled by untimed runs before the timed ones.
        os.environ["VLLM_CACHE_ROOT"] = str(folder / "vllm-cache")
        input_path = folder / "prompts.jsonl"
        input_path.write_text("".join(json.dumps({"id": i, "prompt": p}) + "\n" for i, p in enumerate(prompts)))
        prime_path = folder / "prime.jsonl"
        prime_path.write_text("".join(json.dumps({"id": i, "prompt": p}) + "\n" for i, p in enumerate(prompts[:8])))
        for kind in args.models:
            # vLLM's CPU attention needs heads of 32 or more: the tiny model gets 2 heads of 32 here.
            model_path = build_model(kind, folder, heads=2)
            wait_for_quiet()
            first = way_vllm_offline(model_path, prime_path, args.new_tokens, folder)
            bare = way_vllm_offline(model_path, input_path, args.new_tokens, folder)
            results = {}
            for procs in (2, 1):
                queued = way_fedqueue_vllm(model_path, input_path, args.new_tokens, procs, args.batch_size, folder)
                extra = ["--backend", "vllm", "--batch-size", str(args.batch_size), "--procs", str(procs)]
                cold = (
                    (None, None)
                    if args.no_cold
                    else way_cold_command(
                        model_path, input_path, args.new_tokens, folder, extra, f"-vllm-{procs}", vllm_threads(procs)
                    )
                )
                results[procs] = (queued, cold)
            for procs, (queued, (cold_s, cold_outputs)) in results.items():
                outputs = [queued["outputs"], *([cold_outputs] if cold_outputs else [])]
                same = sum(all(each[i] == bare["outputs"][i] for each in outputs) for i in range(len(prompts)))
                speedup = bare["command_s"] / queued["command_s"]
                rows.append(
                    [
                        kind,
                        procs,
                        f"{bare['command_s']:.1f} s",
                        f"{bare['generate_s']:.1f} s",
                        f"{queued['command_s']:.1f} s",
                        ratio(bare["command_s"], queued["command_s"]),
                        f"{VLLM_TARGETS[procs]:.2f}x {verdict(speedup >= VLLM_TARGETS[procs])}",
                        ratio(bare["generate_s"], queued["command_s"]),
                        "–" if cold_s is None else f"{cold_s:.1f} s",
                        ratio(bare["command_s"], cold_s),
                        f"{same}/{len(prompts)}",
                    ]
                )
                notes.append(
                    f"{kind}, {procs} worker(s) of {vllm_threads(procs)} thread(s): cluster up and engines "
                    f"started {queued['cold_s']:.1f} s (an engine {queued['engine_s']:.1f} s); "
                    f"the command planned {queued['plan']}"
                )
            notes.append(
                f"{kind}: bare vLLM start-up {bare['startup_s']:.1f} s (first run, compile cache empty: "
                f"{first['startup_s']:.1f} s), generate {bare['generate_s']:.1f} s for {bare['tokens']} tokens "
                f"({bare['tokens'] / bare['generate_s']:.0f} tokens/s)"
            )
    print()
    headers = [
        "model",
        "workers",
        "bare vLLM end to end",
        "bare vLLM generate() only",
        "fedqueue+vLLM, workers up",
        "bare/fedqueue",
        "target",
        "bare generate() only/fedqueue",
        "fedqueue+vLLM, nothing running",
        "bare/cold",
        "same output",
    ]
    print(markdown_table(headers, rows))
    print()
    for note in notes:
        print(note)
    print(
        f"{len(prompts)} prompts, {args.new_tokens} new tokens each at most, greedy, float32, --batch-size "
        f"{args.batch_size}; vLLM {vllm.__version__}; {os.cpu_count()} cores"
    )
    print(load.report())


def way_static(model_path: Path, prompts: list[str], new_tokens: int, batch_size: int) -> tuple[float, int]:
    """Sorted static batches in this process, as a worker runs them; seconds and generated tokens."""
    from fedqueue.llm.generate import PromptIn, generate_batch
    from fedqueue.llm.model import load_model
    from fedqueue.llm.planner import plan_batches
    from fedqueue.llm.settings import GenerationSettings

    loaded = load_model(str(model_path), dtype="float32")
    settings = GenerationSettings(max_new_tokens=new_tokens, dtype="float32")
    lengths = [(str(index), len(loaded.tokenizer(prompt)["input_ids"])) for index, prompt in enumerate(prompts)]
    began = time.perf_counter()
    generated = 0
    for batch in plan_batches(lengths, batch_size=batch_size):
        results, _ = generate_batch(loaded, [PromptIn(key, prompts[int(key)]) for key in batch.keys], settings)
        generated += sum(result.generated_tokens for result in results)
    return time.perf_counter() - began, generated


def way_continuous(model_path: Path, prompts: list[str], new_tokens: int) -> tuple[float, int]:
    """transformers' continuous batching (`model.generate_batch`), greedy; seconds and generated tokens."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    tokenizer = AutoTokenizer.from_pretrained(model_path)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
    config = GenerationConfig(
        max_new_tokens=new_tokens,
        do_sample=False,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    inputs = [tokenizer(prompt)["input_ids"] for prompt in prompts]
    began = time.perf_counter()
    results = model.generate_batch(inputs=inputs, generation_config=config, max_new_tokens=new_tokens)
    seconds = time.perf_counter() - began
    return seconds, sum(len(result.generated_tokens) for result in results.values())


def _wait(services: Any, job_id: str, timeout_s: float = 1800) -> None:
    deadline = time.monotonic() + timeout_s
    while services.store.get_run(job_id).state == "running":
        if time.monotonic() > deadline:
            raise TimeoutError(f"job {job_id} still running after {timeout_s} s")
        time.sleep(0.05)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=None, help="default 96; 512 with --vllm")
    parser.add_argument("--new-tokens", type=int, default=None, help="default 32; 64 with --vllm")
    parser.add_argument("--batch-size", type=int, default=None, help="most prompts per batch: 32 (the CLI's default)")
    parser.add_argument("--models", nargs="+", default=None, choices=["tiny", "bench"], help="default: both")
    parser.add_argument("--no-continuous", action="store_true", help="skip the continuous-batching comparison")
    parser.add_argument("--no-cold", action="store_true", help="skip the command with nothing running")
    parser.add_argument("--vllm", action="store_true", help="fedqueue with the vLLM backend against bare vLLM")
    args = parser.parse_args()
    args.prompts = args.prompts or (512 if args.vllm else 96)
    args.new_tokens = args.new_tokens or (64 if args.vllm else 32)
    args.batch_size = args.batch_size or (128 if args.vllm else 32)
    args.models = args.models or (["bench"] if args.vllm else ["tiny", "bench"])
    if args.vllm:
        vllm_main(args)
        return

    info = machine()
    print(machine_line(info))
    prompts = make_prompts(args.prompts)
    rows, commands, notes, strategy = [], [], [], []
    load = ForeignLoad()
    with tempfile.TemporaryDirectory(prefix="fedqueue-bench-llm-") as name:
        folder = Path(name)
        input_path = folder / "prompts.jsonl"
        input_path.write_text("".join(json.dumps({"id": i, "prompt": p}) + "\n" for i, p in enumerate(prompts)))
        for kind in args.models:
            model_path = build_model(kind, folder)
            wait_for_quiet()
            loop_s, loop_outputs, loop_tokens = way_loop(model_path, prompts, args.new_tokens)
            loop_command_s, loop_command_outputs = way_loop_command(model_path, input_path, args.new_tokens, folder)
            queued = way_fedqueue(model_path, input_path, args.new_tokens, args.batch_size, folder)
            same = sum(a == b for a, b in zip(loop_outputs, queued["outputs"], strict=True))
            speedup = loop_s / queued["seconds"]
            rows.append(
                [
                    kind,
                    f"{len(prompts) / loop_s:.1f}",
                    f"{loop_tokens / loop_s:.0f}",
                    f"{len(prompts) / queued['seconds']:.1f}",
                    f"{queued['generated'] / queued['seconds']:.0f}",
                    f"{100 * (queued['pad_fraction'] or 0):.1f} %",
                    ratio(loop_s, queued["seconds"]),
                    f"{TARGETS[kind]:.1f}x {verdict(speedup >= TARGETS[kind])}",
                    f"{same}/{len(prompts)}",
                ]
            )
            cold_s, cold_outputs = (
                (None, None) if args.no_cold else way_cold_command(model_path, input_path, args.new_tokens, folder)
            )
            outputs = [loop_command_outputs, queued["command_outputs"], *([cold_outputs] if cold_outputs else [])]
            same_command = sum(all(each[i] == loop_outputs[i] for each in outputs) for i in range(len(prompts)))
            command_speedup = loop_command_s / queued["command_s"]
            commands.append(
                [
                    kind,
                    f"{loop_command_s:.2f} s",
                    f"{queued['command_s']:.2f} s",
                    ratio(loop_command_s, queued["command_s"]),
                    f"{COMMAND_TARGETS[kind]:.1f}x {verdict(command_speedup >= COMMAND_TARGETS[kind])}",
                    ratio(loop_s, queued["command_s"]),
                    "–" if cold_s is None else f"{cold_s:.2f} s",
                    ratio(loop_command_s, cold_s),
                    f"{same_command}/{len(prompts)}",
                ]
            )
            if not args.no_continuous:
                static_s, static_tokens = way_static(model_path, prompts, args.new_tokens, args.batch_size)
                continuous_s, continuous_tokens = way_continuous(model_path, prompts, args.new_tokens)
                strategy.append(
                    [
                        kind,
                        f"{static_tokens / static_s:.0f}",
                        f"{continuous_tokens / continuous_s:.0f}",
                        ratio(static_s, continuous_s),
                    ]
                )
            notes.append(
                f"{kind}: (a) {loop_s:.2f} s, (b) {queued['seconds']:.2f} s on {queued['procs']} workers in "
                f"{queued['batches']} batches of up to {args.batch_size}; cold start {queued['cold_s']:.1f} s "
                f"(cluster up and the first model load, {queued['model_load_s']:.2f} s of it loading); "
                f"the warm command planned {queued['command_plan']}"
            )
    print()
    print(
        markdown_table(
            [
                "model",
                "(a) prompts/s",
                "(a) tokens/s",
                "(b) prompts/s",
                "(b) tokens/s",
                "(b) padding",
                "b/a",
                "target",
                "same output",
            ],
            rows,
        )
    )
    print()
    print("End to end, command start to exported file:")
    print(
        markdown_table(
            [
                "model",
                "loop command",
                "fedqueue, workers up + model loaded",
                "loop/fedqueue",
                "target",
                "loop generate() only/fedqueue",
                "fedqueue, nothing running",
                "loop/cold",
                "same output",
            ],
            commands,
        )
    )
    if strategy:
        print()
        headers = ["model", "static sorted batches tokens/s", "continuous batching tokens/s", "continuous/static"]
        print(markdown_table(headers, strategy))
    print()
    for note in notes:
        print(note)
    print(f"{len(prompts)} prompts, {args.new_tokens} new tokens each at most, greedy, float32; {os.cpu_count()} cores")
    print(load.report())


if __name__ == "__main__":
    main()
