"""The broker goes away under `fedqueue llm submit -o FILE`: it waits, says so in two lines, writes its file at the end.

A Redis of the test's own on a free port, a real `fedqueue worker` launcher, and the command as a user runs it.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from fedqueue.config import Settings
from fedqueue.core.database import open_store
from fedqueue.llm.results import job_counts, prompt_rows
from fedqueue.llm.settings import GenerationSettings
from fedqueue.queue.embedded import EmbeddedRedis
from tests.llm.test_llm_queue import expected_outputs
from tests.reliability_support import (
    bounce_broker,
    followed_through_the_outage,
    launcher,
    printed_run_id,
    reliable_settings,
    start_follower,
    stop_process,
    wait_until,
)
from tests.support.cli_inputs import cli_env

# Stops and restarts a Redis of its own under real workers: `make test-faults`.
pytestmark = pytest.mark.faults

GENERATION = GenerationSettings(max_new_tokens=16)
PROMPTS = 12  # in 6 batches of 2 on 2 workers: some still queued when the broker goes


def test_llm_submit_waits_for_a_restarted_broker_and_writes_its_file(
    settings: Settings, tmp_path: Path, slow_model_path: Path
) -> None:
    """Redis stopped once a batch is stored and started again empty on its port: exit 0, one line each way,
    every prompt done and exported to -o, the outputs a one-at-a-time loop gives."""
    first = EmbeddedRedis().start()
    settings = reliable_settings(replace(settings, broker_url=first.url))
    input_path = tmp_path / "prompts.jsonl"
    input_path.write_text(
        "".join(json.dumps({"id": i, "prompt": f"Item {i}: " + "go " * i}) + "\n" for i in range(PROMPTS))
    )
    out = tmp_path / "out.jsonl"
    args = ["llm", "submit", str(input_path), "--model", str(slow_model_path), "--batch-size", "2"]
    args += ["--max-new-tokens", str(GENERATION.max_new_tokens), "-o", str(out)]
    store = open_store(settings.database_url, migrate=True)
    second = None
    follower = None
    try:
        with launcher(settings, procs=2, cwd=tmp_path):
            follower, log = start_follower(tmp_path, cli_env(settings), *args)
            job_id = printed_run_id(follower, log)

            def some_stored() -> bool:
                return job_counts(store, job_id).get("done", 0) >= 1 or follower.poll() is not None

            wait_until(some_stored, 90)
            assert follower.poll() is None, log.read_text()[-3000:]
            assert job_counts(store, job_id).get("pending", 0) > 0  # still going when the broker goes
            second = bounce_broker(first, follower, log)
            follower.wait(timeout=180)
    finally:
        if follower is not None:
            stop_process(follower)
        for server in (first, second):
            if server is not None:
                server.stop()
    output = followed_through_the_outage(follower, log)
    assert f"{PROMPTS} lines written to {out}" in output
    exported = [json.loads(line) for line in out.read_text().splitlines()]
    assert [row["state"] for row in exported] == ["done"] * PROMPTS
    rows = prompt_rows(store, job_id)
    assert {row.key: row.output for row in rows} == expected_outputs(slow_model_path, rows, GENERATION)
    store.close()
