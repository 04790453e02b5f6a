"""The vLLM backend for real: real Redis, real worker processes running vLLM's engine, the tiny model.

These run only in a Python that has vLLM (`make test-vllm` runs them from the vLLM venv, where the workers they
start get vLLM too); elsewhere they skip. With FEDQUEUE_TEST_VLLM=required (as `make test` sets) a missing vLLM
fails them instead.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

if importlib.util.find_spec("vllm") is None:
    if os.environ.get("FEDQUEUE_TEST_VLLM") == "required":
        raise RuntimeError("FEDQUEUE_TEST_VLLM=required and vllm is not installed in this Python")
    pytest.skip("vllm is not installed in this Python (make test-vllm runs these with it)", allow_module_level=True)

from fedqueue.config import Settings  # noqa: E402
from fedqueue.llm.job import JobRequest, submit_job  # noqa: E402
from fedqueue.llm.results import prompt_rows  # noqa: E402
from fedqueue.llm.settings import GenerationSettings  # noqa: E402
from fedqueue.llm.tiny import build_tiny_llama  # noqa: E402
from fedqueue.queue.client import open_client_services  # noqa: E402
from tests.conftest import running_workers  # noqa: E402
from tests.llm.test_llm_reliability import assert_the_killed_batch_ran_again, kill_a_worker_mid_batch  # noqa: E402
from tests.support.helpers import wait_finished  # noqa: E402
from tests.support.reliability_support import launcher, reliable_settings, worker_children  # noqa: E402

GENERATION = GenerationSettings(max_new_tokens=24, backend="vllm")  # FIRST_TOKENS
ENGINE_START_S = 400  # two engines starting at once on two cores, torch.compile included, with room to spare
# vLLM's own offline API, as a user runs it: text prompts, greedy, vLLM's own processes and thread binding.
OFFLINE_SCRIPT = """
import json, sys
from vllm import LLM, SamplingParams

if __name__ == "__main__":
    model, sets_path, out_path = sys.argv[1], sys.argv[2], sys.argv[3]
    # vLLM's CPU default reserves 92 % of the machine's memory for its KV cache; 1 GiB is plenty here.
    llm = LLM(model=model, dtype="float32", seed=0, kv_cache_memory_bytes=1 << 30)
    results = []
    for prompts, new_tokens in json.loads(open(sets_path).read()):
        outputs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=new_tokens), use_tqdm=False)
        results.append([output.outputs[0].text for output in outputs])
    open(out_path, "w").write(json.dumps(results))
"""


@pytest.fixture(scope="module", autouse=True)
def vllm_environment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Every engine of this module (workers and the offline reference) shares vLLM's compile cache, and starts
    as vLLM's own CPU test runs do (VLLM_CPU_CI_ENV: torch.compile traces without inductor and skips the warm-up),
    about 18 s instead of 36 s an engine here. The fully compiled path is the one `bench/llm_batch.py --vllm` runs.
    """
    wanted = {"VLLM_CACHE_ROOT": str(tmp_path_factory.mktemp("vllm-cache")), "VLLM_CPU_CI_ENV": "1"}
    previous = {name: os.environ.get(name) for name in wanted}
    os.environ.update(wanted)
    yield
    for name, value in previous.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


@pytest.fixture(scope="module")
def vllm_model_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model with 2 heads of 32 (vLLM's CPU attention has no kernel for the usual tiny's heads of 16)."""
    return build_tiny_llama(tmp_path_factory.mktemp("tiny-llama-vllm"), heads=2)


FIRST_TEXTS = [f"Question {i}: " + "why " * (i * 7 % 23) for i in range(60)]
FIRST_TOKENS = 24
KILL_TEXTS = [f"Item {i}: " + "go " * (i % 7) for i in range(1024)]  # long batches: 256 prompts of up to 160 tokens
KILL_TOKENS = 160


@pytest.fixture(scope="module")
def offline(vllm_model_path: Path, tmp_path_factory: pytest.TempPathFactory) -> list[list[str]]:
    """vLLM's offline `LLM.generate` outputs for both tests' prompts, from one engine in a process of its own."""
    folder = tmp_path_factory.mktemp("offline")
    script, sets_path, out_path = folder / "offline.py", folder / "sets.json", folder / "outputs.json"
    script.write_text(textwrap.dedent(OFFLINE_SCRIPT))
    sets_path.write_text(json.dumps([[FIRST_TEXTS, FIRST_TOKENS], [KILL_TEXTS, KILL_TOKENS]]))
    command = [sys.executable, str(script), str(vllm_model_path), str(sets_path), str(out_path)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=ENGINE_START_S)
    assert done.returncode == 0, done.stderr[-3000:]
    outputs: list[list[str]] = json.loads(out_path.read_text())
    return outputs


def vllm_settings(settings: Settings) -> Settings:
    """A batch's first attempt on a worker starts the engine: the task time limit leaves room for it."""
    return replace(settings, task_time_limit_s=ENGINE_START_S)


def test_jobs_on_two_vllm_workers_equal_vllm_offline_with_one_engine_per_worker(
    settings: Settings, tmp_path: Path, vllm_model_path: Path, offline: list[list[str]]
) -> None:
    settings = vllm_settings(settings)
    lines = [json.dumps({"id": f"q{i}", "prompt": text}) for i, text in enumerate(FIRST_TEXTS)]
    lines.insert(20, "{not JSON")
    lines.insert(40, json.dumps({"id": "long", "prompt": "x" * 400}))  # over the model's 256-token context
    input_path = tmp_path / "prompts.jsonl"
    input_path.write_text("\n".join(lines) + "\n")

    services = open_client_services(settings)
    with running_workers(settings, procs=2, log_dir=tmp_path / "logs"):
        first = submit_job(services, JobRequest(input_path, str(vllm_model_path), GENERATION, batch_size=8, slots=2))
        wait_finished(services.store, first.job_id, ENGINE_START_S)
        # A second job of the same model on the same workers: their engines are already up.
        again = JobRequest(input_path, str(vllm_model_path), GENERATION, batch_size=8, slots=2, job="vllm-again")
        second = submit_job(services, again)
        wait_finished(services.store, second.job_id, 120)

    for job in (first, second):
        rows = prompt_rows(services.store, job.job_id)
        assert [row.line for row in rows] == list(range(1, 63))  # one row per input line, in input order
        by_line = {row.line: row for row in rows}
        assert by_line[21].state == "failed" and "not valid JSON" in (by_line[21].error or "")
        assert by_line[41].state == "failed" and "exceeds the model's context" in (by_line[41].error or "")
        generated = [row for row in rows if row.line not in (21, 41)]
        assert [row.input_id for row in generated] == [f"q{i}" for i in range(60)]
        assert all(row.state == "done" for row in generated)
        assert [row.output for row in generated] == offline[0]  # greedy: token for token vLLM's offline outputs
    # Each worker started its engine on its first batch and kept it for every later batch and the second job.
    first_timings = services.store.task_timings(first.job_id)
    assert len(first.batches) >= 4 and len({t.worker for t in first_timings}) == 2
    starts = [t for t in first_timings if t.load_ms > 2000]
    assert len(starts) <= 2 and len({t.worker for t in starts}) == len(starts)
    assert all(t.load_ms < 2000 for t in services.store.task_timings(second.job_id))
    services.close()


def test_a_vllm_worker_killed_mid_job_loses_nothing(
    settings: Settings, tmp_path: Path, vllm_model_path: Path, offline: list[list[str]]
) -> None:
    settings = vllm_settings(reliable_settings(settings))
    generation = GenerationSettings(max_new_tokens=KILL_TOKENS, backend="vllm")
    input_path = tmp_path / "prompts.jsonl"
    input_path.write_text("".join(json.dumps({"id": i, "prompt": text}) + "\n" for i, text in enumerate(KILL_TEXTS)))
    warm_path = tmp_path / "warm.jsonl"
    warm_path.write_text("".join(json.dumps({"prompt": f"warm {i}"}) + "\n" for i in range(4)))
    services = open_client_services(settings)
    with launcher(settings, procs=2, cwd=tmp_path) as workers:
        # Both workers start their engines first, so the kill lands in the middle of generation.
        warm = submit_job(services, JobRequest(warm_path, str(vllm_model_path), generation, batch_size=1, slots=2))
        wait_finished(services.store, warm.job_id, ENGINE_START_S)
        assert len({t.worker for t in services.store.task_timings(warm.job_id)}) == 2

        request = JobRequest(input_path, str(vllm_model_path), generation, batch_size=256, slots=2)
        killed = kill_a_worker_mid_batch(settings, workers, submit_job(services, request), 120, ENGINE_START_S)
        # Each engine runs inside its worker: no vLLM process of its own, none left behind by the killed one.
        assert not [child for worker in worker_children(workers) for child in worker.children(recursive=True)]
    rows = assert_the_killed_batch_ran_again(services.store, killed)
    assert [row.line for row in rows] == list(range(1, 1025))
    assert [row.output for row in rows] == offline[1]
    services.close()
