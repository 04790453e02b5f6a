"""A FedRevive experiment file, cut down to seconds, read as it is and run on real Redis and real workers.

Their data-free FedRevive (fedrevive.json's keys, cut down to 100 clients, 20 training at once, one update
a version, the cosine beta, their clock and stop rules), on CIFAR-10-shaped generated images with their
`model_name = "convnet"` (read as fedqueue's cnn), makes the same versions and the same weights, bit for
bit, with one worker process or two.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from fedqueue.config import Settings
from fedqueue.fl import api
from fedqueue.fl.config import RunConfig, load_run_config_with_notes
from fedqueue.fl.ml.cifar_fixture import write_cifar_batches
from fedqueue.fl.store.results import device_tasks, list_rounds
from fedqueue.fl.strategy.fedbuff.section import FedBuffSection
from fedqueue.fl.strategy.fedrevive.section import FedReviveSection
from tests.conftest import running_workers
from tests.support.helpers import assert_same_weights

MAX_WAIT_TIME = 1.5  # simulated seconds: 11 versions, from 20 trips of about 1.6 s at once
FREEZE_ROUNDS, WARMUP_ROUNDS = 2, 4


def reduced_fedrevive() -> dict[str, Any]:
    """fedrevive.json with their keys, cut down: 100 clients, 20 at once, a few seconds of their clock."""
    return {
        "setup_random_seed": 10,
        "run_random_seed": 10,
        "gpu_id": 0,
        "wandb_flag": False,
        "num_clients": 100,
        "client_data_size": 20,
        "target_accuracy": 0.99,
        "max_wait_time": MAX_WAIT_TIME,
        "max_rounds": 50000,
        "algorithm": "async_fl",
        "async_fl_settings": {"nb_of_active_jobs": 20, "buffer_size": 1},
        "kd_augmentation": "dfkd",
        "dfkd_settings": {
            "beta": "cosine",
            "adaptive_beta_factor": 15,
            "vis_freq": 100,
            "max_images": 64,
            "synth_batch_size": 8,
            "kd_batch_size": 4,
            "lr": 0.0001,
            "T": 1,
            "kd_buffer_size": 2,
            "lr_g": 0.003,
            "lr_z": 0.001,
            "g_steps": 2,
            "warmup_rounds": WARMUP_ROUNDS,
            "freeze_rounds": FREEZE_ROUNDS,
            "adv": 0.1,
            "bn": 0.003,
            "oh": 1.0,
            "kl_uniform": 0,
            "diversity_loss_weight": 0.0,
            "class_embedding_weight": 0.2,
            "bn_mmt": 0.0,
            "is_maml": False,
            "nz": 16,
            "ngf": 8,
            "reset_l0": False,
            "kd_nb_of_iters": 2,
        },
        "early_stop": [{"round": 1000, "acc": 0.15}],
        "server_lr": 0.1,
        "dataset": "cifar10",
        "model_name": "convnet",
        "val_split": 0.15,
        "kd_split": 0.1,
        "data_distribution": "non_iid_dirichlet",
        "dirichlet_alpha": 0.5,
        "local_batch_size": 4,
        "local_iters": 2,
        "local_optimizer": "adam",
        "local_learning_rate": 0.0003,
        "localtrain_delay": {
            "type": "exponential",
            "mean_distribution": [[0.25, 1], [0.5, 1.3], [0.25, 1.6]],
            "std": 0.2,
        },
        "download_delay": {"type": "constant", "mean_distribution": [[1, 0.1]], "std": 0.2},
        "upload_delay": {"type": "uniform", "mean_distribution": [[0.5, 0.15], [0.5, 0.25]], "std": 0.02},
        "eval_interval": 10,
    }


def versions_on_the_clock(config: RunConfig) -> int:
    """The versions their clock allows before max_wait_time, from the schedule alone (nothing trained)."""
    from fedqueue.fl.setup import run_clock
    from fedqueue.fl.strategy.fedbuff import schedule
    from fedqueue.fl.strategy.registry import rules_of

    config = config.with_keys(pack_size=1)  # how devices are packed into tasks moves no arrival
    trip, rules = run_clock(config).trip_seconds, rules_of(config)
    state, _ = schedule.start(rules, trip)
    events = schedule.advance(state, rules, trip, lambda _: schedule.Outcome(ok=True), stop_after_version=False)
    return sum(isinstance(event, schedule.NewVersion) for event in events)


@pytest.mark.slow
def test_their_reduced_file_makes_the_same_versions_and_weights_with_one_or_two_workers(
    settings: Settings, tmp_path: Path
) -> None:
    write_cifar_batches(tmp_path / "cifar10", train_samples=500, test_samples=100)
    path = tmp_path / "fedrevive.json"
    path.write_text(json.dumps(reduced_fedrevive(), indent=2))
    # pack_mode: "auto" times both modes at each submit; vmapped packs match sequential ones only within tolerance.
    config, notes = load_run_config_with_notes(
        path, {"data_root": str(tmp_path / "cifar10"), "pack_mode": "sequential"}
    )
    assert (config.mode, config.strategy(FedReviveSection).kd_augmentation, config.model) == (
        "fedrevive",
        "dfkd",
        "cnn",
    )
    assert (
        config.num_devices,
        config.strategy(FedBuffSection).concurrency,
        config.strategy(FedBuffSection).buffer_size,
    ) == (100, 20, 1)
    assert config.max_sim_time == MAX_WAIT_TIME and config.timing.phased
    assert any(note.startswith("model_name: convnet is read as fedqueue's cnn") for note in notes)
    expected = versions_on_the_clock(config)
    assert expected > WARMUP_ROUNDS  # the student distils in the later versions

    def run(workers: Callable[[], dict[str, int]]) -> api.RunHandle:
        handle = api.submit(config, settings=settings, worker_slots=workers)
        handle.wait(120)
        status = handle.status()
        assert status["state"] == "finished", status["error"]
        assert status["stop"].startswith(f"stopped: simulated time {MAX_WAIT_TIME:g} reached")
        done = [row.round_index for row in list_rounds(handle.store, handle.id) if row.state == "done"]
        assert done == list(range(1, expected + 1))
        return handle

    with running_workers(settings, procs=1) as first:
        one = run(first.slots)
        with running_workers(settings, procs=1, name="cpu1") as second:  # a second worker process beside it
            two = run(lambda: {**first.slots(), **second.slots()})
    assert [len({row.worker for row in device_tasks(handle.store, handle.id)}) for handle in (one, two)] == [1, 2]
    # Packs were cut differently (two packs per slot), and still the same weights came out.
    assert one.status()["packing"]["pack_size"] != two.status()["packing"]["pack_size"]
    assert_same_weights(one.final_weights(), two.final_weights())
