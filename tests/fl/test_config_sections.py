"""The run config's sections: flat keys in the file and the store, each held and checked by the section that
declares it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from fedqueue.errors import ConfigError, DataError
from fedqueue.fl.clock.delays import FEDREVIVE_CLOCK
from fedqueue.fl.clock.section import ClockSection
from fedqueue.fl.config import RunConfig, config_sections
from fedqueue.fl.ml.data_section import DataSection
from fedqueue.fl.ml.train_section import TrainingSection
from fedqueue.fl.packs.section import PackSection

SPEED = {"mean": [0.01, 0.04], "std": [0.001, 0.004], "share": [0.7, 0.3]}


def test_the_clock_keys_are_flat_in_the_file_and_held_by_the_clock_section() -> None:
    config = RunConfig.from_dict({"device_speed": SPEED, "communication_delay": {"mean": 0.5}})
    assert config.timing == ClockSection(device_speed=SPEED, communication_delay={"mean": 0.5})
    assert config.timing.per_sample and not config.timing.phased
    flat = config.to_dict()
    assert flat["device_speed"] == SPEED and flat["clock"] == "per_sample" and "timing" not in flat
    # The stored dict reads back to the same config, its keys where the section stands among the run's.
    assert RunConfig.from_stored(json.loads(json.dumps(flat))) == config
    keys = list(flat)
    assert keys.index("kd_split") < keys.index("device_speed") < keys.index("upload_delay") < keys.index("plugin")

    phased = config.with_keys(clock=FEDREVIVE_CLOCK, device_speed={}, communication_delay={})
    assert phased.timing.phased and phased.timing.device_speed == {} and phased.seed == config.seed
    with pytest.raises(TypeError, match="timing"):
        config.with_keys(timing=ClockSection())  # a section's field is no key


def test_the_clock_section_checks_its_keys_naming_each() -> None:
    refused: list[tuple[dict[str, Any], str]] = [
        ({"clock": "wall"}, "clock: unknown clock 'wall'"),
        ({"clock": FEDREVIVE_CLOCK, "device_speed": SPEED}, 'device_speed: applies to clock = "per_sample"'),
        ({"upload_delay": {"type": "constant"}}, 'upload_delay: applies to clock = "fedrevive"'),
        ({"communication_delay": {"mean": [1.0, 2.0]}}, "communication_delay.mean: one number"),
    ]
    _assert_refused(refused)


def test_packing_keys_are_held_by_its_section_and_auto_is_resolved_before_a_task_reads_them() -> None:
    config = RunConfig.from_dict({"pack_size": 4, "pack_mode": "vmap"})
    assert config.packing == PackSection(pack_size=4, pack_mode="vmap")
    assert (config.packing.resolved_size, config.packing.resolved_mode) == (4, "vmap")
    assert config.to_dict()["pack_size"] == 4 and "packing" not in config.to_dict()
    auto = RunConfig.from_dict({})
    assert auto.packing.pack_size == "auto"
    with pytest.raises(ConfigError, match='^pack_size: "auto" is resolved when the run is submitted'):
        assert auto.packing.resolved_size
    chosen = auto.with_keys(pack_size=2, pack_mode="sequential", pack_choice="by hand")
    assert chosen.packing == PackSection(2, "sequential", "by hand") and auto.packing.pack_size == "auto"
    for raw, message in [({"pack_size": "big"}, "pack_size: a positive integer"), ({"pack_mode": "x"}, "pack_mode")]:
        with pytest.raises(ConfigError, match=f"^{message}"):
            RunConfig.from_dict(raw)


def test_the_reference_lists_the_shared_sections_after_the_run_s_own_keys() -> None:
    headings = [(heading, section) for heading, section, _ in config_sections()]
    assert headings[:5] == [
        ("Every run", RunConfig),
        ("The data (every mode)", DataSection),
        ("Local training (every mode)", TrainingSection),
        ("Packing devices into tasks (every mode)", PackSection),
        ("The simulated clock (every mode)", ClockSection),
    ]
    run_keys = config_sections()[0][2]
    assert not {"clock", "timing", "pack_size", "packing", "dataset", "data", "local_iters", "training"} & set(run_keys)


def test_the_data_keys_are_held_by_the_data_section_and_stored_flat(tmp_path: Path) -> None:
    root = str(tmp_path)
    fixed = {"partition": "dirichlet_fixed", "client_data_size": 20, "augment": "crop_flip"}
    config = RunConfig.from_dict({"dataset": "cifar10", "data_root": root, **fixed})
    expected = DataSection("cifar10", root, partition="dirichlet_fixed", client_data_size=20, augment="crop_flip")
    assert config.data == expected
    assert config.data.fixed_shards and config.data.missing_root is None
    flat = config.to_dict()
    assert flat["partition"] == "dirichlet_fixed" and flat["val_split"] == 0.15 and "data" not in flat
    assert RunConfig.from_stored(json.loads(json.dumps(flat))) == config
    moved = config.with_keys(data_root=str(tmp_path / "gone"))
    assert moved.data.missing_root == str(tmp_path / "gone") and moved.data.partition == "dirichlet_fixed"
    with pytest.raises(DataError, match="^data_root: dataset root '.*gone' does not exist$"):
        RunConfig.from_dict(moved.to_dict())
    assert RunConfig.from_dict(moved.to_dict(), check_data=False) == moved


def test_the_data_section_checks_its_keys_naming_each() -> None:
    refused: list[tuple[dict[str, Any], str]] = [
        ({"dataset": "mnist"}, "dataset: unknown dataset 'mnist'"),
        ({"dataset": "cifar100"}, "data_root: the cifar100 dataset needs data_root"),
        ({"partition": "shards"}, "partition: unknown partition 'shards'"),
        ({"alpha": 0}, "alpha: must be greater than 0"),
        ({"samples_per_device": 0}, "samples_per_device: must be a positive integer"),
        ({"augment": "crop_flip"}, 'augment: "crop_flip" crops 32x32 images'),
        ({"partition": "dirichlet_fixed", "client_data_size": 9, "val_split": 0.9}, "val_split: val_split + kd_split"),
        # kd_split is the run's (FedRevive's held-out share); the fixed shards leave it out in every mode.
        ({"partition": "dirichlet_fixed", "client_data_size": 9, "kd_split": 1.0}, "kd_split: a share of the"),
    ]
    _assert_refused(refused)


def test_the_local_training_keys_are_held_by_the_training_section() -> None:
    config = RunConfig.from_dict({"local_iters": 5, "local_optimizer": "adam", "local_lr": 0.01})
    assert config.training == TrainingSection(local_iters=5, local_optimizer="adam", local_lr=0.01)
    assert config.training.effective_epochs is None
    assert config.to_dict()["local_iters"] == 5 and "training" not in config.to_dict()
    assert RunConfig.from_stored(json.loads(json.dumps(config.to_dict()))) == config
    # Neither steps nor passes set: one pass over the device's data.
    by_epoch = config.with_keys(local_iters=None)
    assert by_epoch.training.effective_epochs == 1 and by_epoch.training.local_optimizer == "adam"
    assert config.plugin_names()["local_step"] == "cross_entropy"
    assert config.with_keys(local_step="pkg.mod:step").plugin_names()["local_step"] == "pkg.mod:step"


def test_the_training_section_checks_its_keys_naming_each() -> None:
    refused: list[tuple[dict[str, Any], str]] = [
        ({"local_iters": 2, "local_epochs": 1}, "local_iters: set either local_iters or local_epochs, not both"),
        ({"local_epochs": 0}, "local_epochs: must be a positive integer, got 0"),
        ({"local_batch_size": -1}, "local_batch_size: must be a positive integer, got -1"),
        ({"local_optimizer": "rmsprop"}, "local_optimizer: unknown local_optimizer 'rmsprop' (choose from sgd, adam)"),
        ({"local_lr": 0}, "local_lr: must be greater than 0, got 0.0"),
        ({"local_momentum": 1}, "local_momentum: must be in [0, 1), got 1.0"),
        ({"local_step": "nope"}, "local_step: unknown local_step 'nope'"),
    ]
    _assert_refused(refused)


def _assert_refused(refused: list[tuple[dict[str, Any], str]]) -> None:
    """Each config refused with a line that starts as given."""
    for raw, message in refused:
        with pytest.raises(ConfigError) as raised:
            RunConfig.from_dict(raw)
        assert str(raised.value).startswith(message), (raw, str(raised.value))
