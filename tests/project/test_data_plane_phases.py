"""bench/data_plane_phases.py on a tiny state: every phase of an update's trip is timed, and its probe blob is gone."""

from __future__ import annotations

from types import ModuleType

import pytest
import redis
import torch

from tests.support.bench_scripts import load_bench_module


@pytest.fixture(scope="module")
def phases() -> ModuleType:
    return load_bench_module("data_plane_phases")


def test_every_phase_of_a_tiny_update_is_timed_and_its_probe_deleted(
    phases: ModuleType, redis_url: str, key_prefix: str
) -> None:
    from fedqueue.fl.ml.weights import encode_state

    state = {"weight": torch.arange(12, dtype=torch.float32).reshape(3, 4), "steps": torch.tensor(3)}
    client = redis.Redis.from_url(redis_url)
    costs = phases.phase_costs(state, client, key_prefix, repeats=2)
    assert costs.nbytes == len(encode_state(state))
    assert set(costs.ms) == set(phases.PHASES)
    # The timed calls really ran: encoding and a Redis round trip each take some time.
    assert costs.ms["encode"] > 0 and costs.ms["put"] > 0 and costs.ms["get"] > 0
    assert costs.total_ms == pytest.approx(sum(costs.ms.values()))
    assert list(client.scan_iter(match=f"{key_prefix}:data-plane-probe:*")) == []
