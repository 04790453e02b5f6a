"""The fedbuff knobs in a run config: defaults, and bad values refused naming the field."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from fedqueue.errors import ConfigError
from fedqueue.fl.config import RunConfig
from fedqueue.fl.strategy.fedbuff.section import FedBuffSection
from fedqueue.fl.strategy.fedrevive.section import FedReviveSection

BASE: dict[str, Any] = {"dataset": "digits", "num_devices": 20, "devices_per_round": 10, "rounds": 3}


def config(**overrides: Any) -> RunConfig:
    return RunConfig.from_dict({**BASE, "mode": "fedbuff", **overrides})


def test_defaults_follow_the_sync_knobs() -> None:
    chosen = config()
    assert chosen.strategy(FedBuffSection).resolved_concurrency(chosen) == 10  # devices_per_round
    assert chosen.last_version == 3  # rounds
    assert (
        chosen.strategy(FedBuffSection).buffer_size,
        chosen.strategy(FedBuffSection).staleness_weight,
        chosen.strategy(FedBuffSection).device_reuse,
        chosen.strategy(FedBuffSection).min_refill,
    ) == (
        10,
        "none",
        True,
        1,
    )
    assert config(concurrency=12, max_model_version=7).last_version == 7
    assert RunConfig.from_dict({**BASE, "max_model_version": 9}).last_version == 3  # fedavg counts rounds


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"mode": "fedprox"}, "mode"),  # no such strategy here
        ({"concurrency": 0}, "concurrency"),
        ({"concurrency": 21}, "concurrency"),
        ({"buffer_size": 21}, "buffer_size"),
        ({"buffer_size": 0}, "buffer_size"),
        ({"min_refill": 11}, "min_refill"),
        ({"concurrency": 8}, "buffer_size"),  # the default buffer of 10 never fills from 8 devices at once
        ({"concurrency": 8, "buffer_size": 9}, "buffer_size"),
        ({"max_staleness": -1}, "max_staleness"),
        ({"staleness_weight": "linear"}, "staleness_weight"),
        ({"staleness_exponent": -0.5}, "staleness_exponent"),
        ({"device_reuse": "yes"}, "device_reuse"),
        ({"device_reuse": False, "buffer_size": 10}, "device_reuse"),
        ({"aggregate": "median"}, "aggregate"),
        ({"device_speed": {"mean": [0.1, 0.2], "std": [0.1]}}, "device_speed.std"),
        ({"device_speed": {"std": [0.1]}}, "device_speed.mean"),
        ({"device_speed": {"mean": [-1.0]}}, "device_speed.mean"),
        ({"device_speed": {"mean": [1.0], "share": [0]}}, "device_speed.share"),
        ({"device_speed": {"mean": [1.0], "speed": 2}}, "device_speed"),
        ({"communication_delay": {"mean": [1.0, 2.0]}}, "communication_delay.mean"),
        ({"communication_delay": {"mean": "fast"}}, "communication_delay.mean"),
        ({"communication_delay": {"jitter": 1}}, "communication_delay"),
        ({"clock": "wall"}, "clock"),
        ({"clock": "flare"}, "clock"),  # FLARE's tiers are its device_speed: required
        ({"localtrain_delay": {"type": "exponential"}}, "localtrain_delay"),  # the per-sample clock has no phases
        ({"clock": "fedrevive", "device_speed": {"mean": [0.1]}}, "device_speed"),
        ({"clock": "fedrevive", "upload_delay": {"jitter": 1}}, "upload_delay"),
        ({"clock": "fedrevive", "upload_delay": {"type": "gamma"}}, "upload_delay.type"),
        ({"clock": "fedrevive", "upload_delay": {"type": 3}}, "upload_delay.type"),
        (
            {"clock": "fedrevive", "download_delay": {"mean_distribution": [[1, -0.1]]}},
            "download_delay.mean_distribution",
        ),
        (
            {"clock": "fedrevive", "download_delay": {"mean_distribution": [[0, 0.1]]}},
            "download_delay.mean_distribution",
        ),
        ({"clock": "fedrevive", "download_delay": {"mean_distribution": [0.1]}}, "download_delay.mean_distribution"),
        (
            {"clock": "fedrevive", "download_delay": {"mean_distribution": [[1e308, 0.1], [1e308, 0.2]]}},
            "download_delay.mean_distribution",
        ),
        ({"clock": "fedrevive", "download_delay": {"mean_distribution": []}}, "download_delay.mean_distribution"),
        (
            {"clock": "fedrevive", "localtrain_delay": {"mean_distribution": [[1, True]]}},
            "localtrain_delay.mean_distribution",
        ),
        ({"clock": "fedrevive", "localtrain_delay": {"std": -0.2}}, "localtrain_delay.std"),
        ({"clock": "fedrevive", "localtrain_delay": {"std": "wide"}}, "localtrain_delay.std"),
        ({"staleness_weight": "afl_dw", "staleness_s_max": 0}, "staleness_s_max"),
        ({"staleness_s_max": "75"}, "staleness_s_max"),
    ],
)
def test_bad_knobs_name_their_field(overrides: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError, match=rf"^{field.replace('.', '[.]')}:"):
        config(**overrides)


def test_a_buffer_larger_than_the_devices_training_at_once_is_refused_in_one_line() -> None:
    with pytest.raises(ConfigError) as refused:
        config(concurrency=4, buffer_size=6)
    assert str(refused.value) == (
        "buffer_size: 6 updates per version is more than concurrency = 4 devices training at once;"
        " set buffer_size to at most 4 or raise concurrency"
    )
    with pytest.raises(ConfigError, match=r"^buffer_size: 10 .* concurrency \(devices_per_round\) = 5 "):
        config(devices_per_round=5)
    assert config(concurrency=4, buffer_size=4).strategy(FedBuffSection).buffer_size == 4
    # A synchronous run has no buffer: its buffer_size is never read.
    assert RunConfig.from_dict({**BASE, "devices_per_round": 5}).to_dict()["buffer_size"] == 10


def test_clock_tables_apply_to_sync_runs_too() -> None:
    speeds = {"mean": [0.01, 0.04], "std": [0.001, 0.004], "share": [0.7, 0.3]}
    chosen = RunConfig.from_dict({**BASE, "device_speed": speeds, "communication_delay": {"mean": 1, "std": 0.2}})
    assert chosen.timing.device_speed == speeds
    with pytest.raises(ConfigError, match="^device_speed.share:"):
        RunConfig.from_dict({**BASE, "device_speed": {"mean": [1.0], "share": [1, 2]}})


def test_fedrevive_clock_reads_their_tables() -> None:
    """Their keys and values as their afl_dw.json writes them; a table left out is theirs."""
    chosen = config(
        clock="fedrevive",
        localtrain_delay={"type": "exponential", "mean_distribution": [[0.25, 1], [0.5, 1.3], [0.25, 1.6]], "std": 0.2},
        upload_delay={"type": "uniform", "mean_distribution": [[0.5, 0.05], [0.5, 0.10]], "std": 0.01},
        staleness_weight="afl_dw",
        staleness_s_max=75,
    )
    assert (chosen.timing.clock, chosen.timing.download_delay, chosen.strategy(FedBuffSection).staleness_s_max) == (
        "fedrevive",
        {},
        75.0,
    )
    assert config().timing.clock == "per_sample" and config().strategy(FedBuffSection).staleness_s_max == 75.0
    assert config(clock="flare", device_speed={"mean": [100, 200, 400], "std": [1, 2, 4]}).timing.clock == "flare"
    assert config(staleness_weight="flare_sqrt").strategy(FedBuffSection).staleness_weight == "flare_sqrt"


def test_the_examples_load(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The async examples validate and build their clocks (CIFAR-10 read from ./data/cifar10, as in compose)."""
    from fedqueue.fl.config import load_run_config
    from fedqueue.fl.ml.cifar_fixture import write_cifar_batches
    from fedqueue.fl.ml.data import load_federated
    from fedqueue.fl.setup import data_spec, device_clock

    examples = Path(__file__).resolve().parents[4] / "examples"
    write_cifar_batches(tmp_path / "data" / "cifar10", train_samples=20000, test_samples=100)
    monkeypatch.chdir(tmp_path)
    for name in (
        "digits_fedbuff.toml",
        "cifar10_fedbuff.toml",
        "cifar10_fedrevive.toml",
        "cifar10_fedrevive_dfkd.toml",
    ):
        config = load_run_config(examples / name)
        assert config.strategy_mode.asynchronous
        clock = device_clock(config, load_federated(data_spec(config)))
        assert all(clock.trip_seconds(1, device) > 0 for device in range(config.num_devices))


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"kd_split": 0}, "kd_split"),
        ({"kd_split": 1.5}, "kd_split"),
        ({"kd_beta": "sigmoid"}, "kd_beta"),
        ({"kd_beta": 1.5}, "kd_beta"),
        ({"kd_beta": True}, "kd_beta"),
        ({"kd_version": "avg"}, "kd_version"),
        ({"kd_iters": 0}, "kd_iters"),
        ({"kd_temperature": 0}, "kd_temperature"),
        ({"kd_buffer_size": -1}, "kd_buffer_size"),
        ({"kd_augmentation": "gan"}, "kd_augmentation"),
        ({"dfkd": {"nz": 8}}, "dfkd"),  # the table belongs to kd_augmentation = "dfkd"
        ({"kd_augmentation": "dfkd", "dfkd": {"nzz": 8}}, "dfkd"),
        ({"kd_augmentation": "dfkd", "dfkd": {"nz": 8.5}}, "dfkd.nz"),
        ({"kd_augmentation": "dfkd", "dfkd": {"lr_g": "fast"}}, "dfkd.lr_g"),
        ({"kd_augmentation": "dfkd", "dfkd": {"freeze_rounds": -1}}, "dfkd.freeze_rounds"),
    ],
)
def test_bad_fedrevive_knobs_name_their_field(overrides: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError, match=rf"^{field}:"):
        config(mode="fedrevive", **overrides)


def test_fedrevive_holds_out_its_kd_split() -> None:
    revive = config(mode="fedrevive", kd_beta="cosine", kd_beta_factor=75)
    assert (
        revive.held_out == 0.1
        and revive.strategy_mode.asynchronous
        and revive.strategy(FedReviveSection).kd_beta == "cosine"
    )
    assert config().held_out == 0.0  # fedbuff's devices share the whole training set


def test_data_free_fedrevive_holds_nothing_out() -> None:
    free = config(mode="fedrevive", kd_augmentation="dfkd", dfkd={"nz": 16, "lr_g": 0.01, "freeze_rounds": 0})
    assert free.data_free and free.held_out == 0.0 and free.strategy(FedReviveSection).dfkd["nz"] == 16
    assert not config(mode="fedrevive").data_free
