"""The broker goes away under `fedqueue llm submit -o FILE`: it waits, says so in two lines, writes its file at the end.

A Redis of the test's own on a free port, a real `fedqueue worker` launcher, and the command as a user runs it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fedqueue.core.database import open_store
from fedqueue.llm.results import job_counts, prompt_rows
from fedqueue.llm.settings import GenerationSettings
from tests.llm.test_llm_queue import expected_outputs
from tests.support.reliability_support import (
    BrokerOutage,
    broker_outage_fixture,  # noqa: F401 - the broker_outage fixture
    followed_through_the_outage,
    launcher,
    printed_run_id,
    wait_until,
)

# Stops and restarts a Redis of its own under real workers: `make test-faults`.
pytestmark = pytest.mark.faults

GENERATION = GenerationSettings(max_new_tokens=16)
PROMPTS = 12  # in 6 batches of 2 on 2 workers: some still queued when the broker goes


def test_llm_submit_waits_for_a_restarted_broker_and_writes_its_file(
    broker_outage: BrokerOutage, tmp_path: Path, slow_model_path: Path
) -> None:
    """Redis stopped once a batch is stored and started again empty on its port: exit 0, one line each way,
    every prompt done and exported to -o, the outputs a one-at-a-time loop gives."""
    settings = broker_outage.settings
    input_path = tmp_path / "prompts.jsonl"
    input_path.write_text(
        "".join(json.dumps({"id": i, "prompt": f"Item {i}: " + "go " * i}) + "\n" for i in range(PROMPTS))
    )
    out = tmp_path / "out.jsonl"
    args = ["llm", "submit", str(input_path), "--model", str(slow_model_path), "--batch-size", "2"]
    args += ["--max-new-tokens", str(GENERATION.max_new_tokens), "-o", str(out)]
    store = open_store(settings.database_url, migrate=True)
    with launcher(settings, procs=2, cwd=tmp_path):
        follower, log = broker_outage.follow(*args)
        job_id = printed_run_id(follower, log)

        def some_stored() -> bool:
            return job_counts(store, job_id).get("done", 0) >= 1 or follower.poll() is not None

        wait_until(some_stored, 90)
        assert follower.poll() is None, log.read_text()[-3000:]
        assert job_counts(store, job_id).get("pending", 0) > 0  # still going when the broker goes
        broker_outage.bounce(follower, log)
        follower.wait(timeout=180)
    output = followed_through_the_outage(follower, log)
    assert f"{PROMPTS} lines written to {out}" in output
    exported = [json.loads(line) for line in out.read_text().splitlines()]
    assert [row["state"] for row in exported] == ["done"] * PROMPTS
    rows = prompt_rows(store, job_id)
    assert {row.key: row.output for row in rows} == expected_outputs(slow_model_path, rows, GENERATION)
    store.close()
