"""Real Redis and workers: every new global model of a run with StatTrackers has them at 0 and 1."""

from __future__ import annotations

import pytest
import torch

from fedqueue.config import Settings
from fedqueue.fl import api
from tests.conftest import running_workers
from tests.support.helpers import small_config

FEDBUFF = {"mode": "fedbuff", "concurrency": 4, "buffer_size": 2, "max_model_version": 3}


@pytest.mark.parametrize("extra", [{}, FEDBUFF], ids=["sync", "fedbuff"])
def test_trackers_are_reset_in_every_new_global_model(settings: Settings, extra: dict[str, object]) -> None:
    config = small_config(model="tests.support.plugin_modules.fq_tracked:tiny", rounds=2, **extra)
    with running_workers(settings, procs=1):
        handle = api.submit(config, settings=settings)
        handle.wait(180)
    assert handle.status()["state"] == "finished", handle.status()["error"]
    final = handle.final_weights()
    assert torch.equal(final["stat_track.running_mean"], torch.zeros(4)) and torch.equal(
        final["stat_track.running_var"], torch.ones(4)
    )
    assert not torch.equal(final["conv.weight"], torch.zeros_like(final["conv.weight"]))
