"""The core's timing row, which every kind's worker builds its task's timing with."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

from fedqueue.core.timing import timing_of


@dataclass(frozen=True)
class Message:
    run_id: str
    enqueued_at: float


def test_a_row_takes_its_run_and_enqueue_time_from_the_message_and_is_finished_now() -> None:
    before = time.time()
    timing = timing_of(
        Message("r1", 10.0),
        kind="toy",
        task_type="square",
        task="square 3",
        round_index=None,
        state="done",
        worker="w1",
        attempt=2,
        device_used="cpu",
        started_at=11.0,
        compute_ms=5.0,
    )
    assert (timing.run_id, timing.enqueued_at, timing.started_at, timing.compute_ms) == ("r1", 10.0, 11.0, 5.0)
    assert (timing.load_ms, timing.upload_ms, timing.error, timing.pack) == (0.0, 0.0, None, None)
    assert before <= timing.finished_at <= time.time() and timing.pid == os.getpid()


def test_a_long_device_label_is_cut_to_the_column_and_a_given_finish_is_kept() -> None:
    uuid = "cuda:GPU-8f3c2a1e-5b7d-4e9a-9c0b-123456789abc"
    timing = timing_of(
        Message("r1", 1.0),
        kind="fl",
        task_type="train",
        task="round 1 device 0",
        round_index=1,
        state="failed",
        worker="w",
        attempt=1,
        device_used=uuid,
        started_at=2.0,
        finished_at=3.0,
        error="boom",
        pack="pack 0-3",
    )
    assert timing.device_used == uuid[:32] and timing.finished_at == 3.0
    assert (timing.round_index, timing.error, timing.pack) == (1, "boom", "pack 0-3")
