"""FedRevive's five CIFAR-10 experiment files, written here with their keys and values, read as they are.

Each resolves to the knobs listed beside it; a key fedqueue does not know is refused by name; `fedqueue check`
prints TOML that `fedqueue run` reads back to the same config.
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import pytest

from fedqueue.errors import ConfigError
from fedqueue.fl.config import RunConfig, config_toml, load_run_config, load_run_config_with_notes
from fedqueue.fl.strategy.fedbuff.section import FedBuffSection
from fedqueue.fl.strategy.fedrevive.section import FedReviveSection
from tests.support.cli_runner import fedqueue_cli


def their_file(name: str) -> dict[str, Any]:
    """The keys every one of their CIFAR-10 files carries, with fedbuff.json's values."""
    return {
        "setup_random_seed": 10,
        "run_random_seed": 10,
        "log_dir": "logs",
        "train_device": "cuda",
        "model_device": "cuda",
        "data_device": "cpu",
        "gpu_id": 0,
        "continue_exp_from": f"./ExperimentOuts/cifar10/{name}",
        "save_exp_state_interval": 10,
        "num_clients": 1000,
        "client_data_size": 350,
        "target_accuracy": 0.85,
        "max_wait_time": 17500,
        "max_rounds": 50000,
        "algorithm": "async_fl",
        "async_fl_settings": {"nb_of_active_jobs": 100, "buffer_size": 2},
        "sync_fl_settings": {"nb_of_active_jobs": 100},
        "kd_augmentation": None,
        "simple_kd_settings": {
            "learning_rate": 0.0003,
            "nb_of_iters": 10,
            "batch_size": 32,
            "beta": 0.5,
            "adaptive_beta_factor": 1.5,
            "temperature": 2.0,
            "kd_buffer_size": 8,
            "kd_version": "distribution_match_batch",
            "weighted_avg": False,
            "weighted_class_loss": False,
        },
        "dfkd_settings": {
            "beta": 0.5,
            "adaptive_beta_factor": 1.5,
            "vis_freq": 100,
            "max_images": 16000,
            "synth_batch_size": 64,
            "kd_batch_size": 32,
            "lr": 0.0001,
            "T": 1,
            "kd_buffer_size": 8,
            "lr_g": 0.003,
            "lr_z": 0.001,
            "g_steps": 2,
            "warmup_rounds": 100,
            "freeze_rounds": 50,
            "adv": 0.1,
            "bn": 0.003,
            "oh": 1.0,
            "kl_uniform": 0,
            "diversity_loss_weight": 0.0,
            "class_embedding_weight": 0.2,
            "bn_mmt": 0.0,
            "is_maml": False,
            "nz": 256,
            "ngf": 128,
            "reset_l0": False,
            "kd_nb_of_iters": 10,
        },
        "early_stop": [{"round": 1000, "acc": 0.15}],
        "server_lr": 0.05,
        "dataset": "cifar10",
        "val_split": 0.15,
        "test_split": 0.15,
        "kd_split": 0.1,
        "external_kd_dataset": None,
        "data_distribution": "non_iid_dirichlet",
        "dirichlet_alpha": 0.5,
        "local_batch_size": 32,
        "local_iters": 25,
        "local_optimizer": "adam",
        "local_learning_rate": 0.0003,
        "local_momentum": 0.9,
        "localtrain_delay": {
            "type": "exponential",
            "mean_distribution": [[0.25, 1], [0.5, 1.3], [0.25, 1.6]],
            "std": 0.2,
        },
        "download_delay": {"type": "constant", "mean_distribution": [[1, 0.1]], "std": 0.2},
        "upload_delay": {"type": "uniform", "mean_distribution": [[0.5, 0.15], [0.5, 0.25]], "std": 0.02},
        "eval_interval": 10,
        "save_model_interval": 100,
        "eval_batch_size": 300,
        "save_plot": True,
        "wandb_flag": False,
        "wandb_entity": None,
        "wandb_project": "cifar10",
        "wandb_run_name": name,
        "wandb_group": name,
        "out_dir": f"./ExperimentOuts/cifar10/{name}",
    }


def fedavg() -> dict[str, Any]:
    data = their_file("fedavg")
    data.update(algorithm="sync_fl", server_lr=1.4, eval_interval=1, wandb_flag=True)
    return data


def fedbuff() -> dict[str, Any]:
    return their_file("fedbuff")


def fedrevive() -> dict[str, Any]:
    data = their_file("fedrevive")
    data["async_fl_settings"]["buffer_size"] = 1
    data["dfkd_settings"].update(beta="cosine", adaptive_beta_factor=75)
    data.update(kd_augmentation="dfkd", server_lr=0.1, wandb_flag=True)
    return data


def dd_fedrevive() -> dict[str, Any]:
    data = their_file("dd_fedrevive")
    data["async_fl_settings"]["buffer_size"] = 1
    data.update(kd_augmentation="simple_kd", server_lr=0.2)
    return data


def afl_dw() -> dict[str, Any]:
    data = their_file("afl_dw")
    data["async_fl_settings"]["buffer_size"] = 1
    data["dfkd_settings"].update(beta="cosine", adaptive_beta_factor=75)
    data.update(async_downweighting=True, server_lr=0.1)
    return data


COMMON = {
    "seed": 10,
    "num_devices": 1000,
    "local_iters": 25,
    "local_batch_size": 32,
    "local_optimizer": "adam",
    "local_lr": 0.0003,
    "alpha": 0.5,
    "partition": "dirichlet_fixed",
    "client_data_size": 350,
    "val_split": 0.15,
    "augment": "crop_flip",
    "model": "resnet18_fedrevive",
    "dataset": "cifar10",
    "clock": "fedrevive",
    "max_sim_time": 17500.0,
    "target_accuracy": 0.85,
    "early_stop": [{"version": 1000, "accuracy": 0.15}],
}
EXPECTED = {
    "fedavg": (
        fedavg,
        {"mode": "fedavg", "devices_per_round": 100, "global_lr": 1.4, "eval_every": 1, "rounds": 50000},
    ),
    "fedbuff": (
        fedbuff,
        {"mode": "fedbuff", "concurrency": 100, "buffer_size": 2, "global_lr": 0.05, "staleness_weight": "none"},
    ),
    "fedrevive": (
        fedrevive,
        {
            "mode": "fedrevive",
            "kd_augmentation": "dfkd",
            "buffer_size": 1,
            "global_lr": 0.1,
            "kd_beta": "cosine",
            "kd_beta_factor": 75.0,
            "kd_lr": 0.0001,
            "kd_temperature": 1.0,
            "kd_iters": 10,
            "kd_buffer_size": 8,
            "max_model_version": 50000,
        },
    ),
    "dd_fedrevive": (
        dd_fedrevive,
        {
            "mode": "fedrevive",
            "kd_augmentation": "simple_kd",
            "global_lr": 0.2,
            "kd_beta": 0.5,
            "kd_lr": 0.0003,
            "kd_temperature": 2.0,
            "kd_split": 0.1,
            "kd_version": "distribution_match_batch",
        },
    ),
    "afl_dw": (
        afl_dw,
        {"mode": "fedbuff", "staleness_weight": "afl_dw", "staleness_s_max": 75.0, "buffer_size": 1, "global_lr": 0.1},
    ),
}


def _write(tmp_path: Path, name: str, data: dict[str, Any]) -> Path:
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(data, indent=2))
    return path


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_their_file_is_read_as_it_is_and_resolves_to_these_knobs(name: str, tmp_path: Path) -> None:
    make, knobs = EXPECTED[name]
    config, notes = load_run_config_with_notes(_write(tmp_path, name, make()), {"data_root": str(tmp_path)})
    for key, value in {**COMMON, **knobs}.items():
        assert config.to_dict()[key] == value, key
    assert config.name == name
    assert "gpu_id: ignored: workers own their GPUs (`fedqueue worker --gpus`)" in notes
    assert any(note.startswith("wandb_flag: ignored") for note in notes)


def test_their_dfkd_settings_become_the_synthesizer_s_knobs(tmp_path: Path) -> None:
    config = load_run_config(_write(tmp_path, "fedrevive", fedrevive()), {"data_root": str(tmp_path)})
    assert (
        config.strategy(FedReviveSection).dfkd["pool_size"] == 16000
        and config.strategy(FedReviveSection).dfkd["freeze_rounds"] == 50
    )
    assert (
        config.strategy(FedReviveSection).dfkd["lr_g"],
        config.strategy(FedReviveSection).dfkd["g_steps"],
        config.strategy(FedReviveSection).dfkd["bn"],
    ) == (0.003, 2, 0.003)
    assert config.timing.localtrain_delay["mean_distribution"] == [[0.25, 1], [0.5, 1.3], [0.25, 1.6]]


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (lambda data: data.update(cloud_bucket="s3://x"), "cloud_bucket"),
        (lambda data: data["dfkd_settings"].update(mystery=1), "dfkd_settings.mystery"),
        (lambda data: data.update(dataset="femnist"), "dataset"),
        (lambda data: data.update(model_name="t5-small"), "model_name"),
        (lambda data: data.update(data_distribution="pathological"), "data_distribution"),
        (lambda data: data.update(algorithm="semi_async"), "algorithm"),
        (lambda data: data.update(early_stop=[{"round": 1000}]), "early_stop"),
        (lambda data: data.update(external_kd_dataset="kd.pth"), "external_kd_dataset"),
        (lambda data: data.update(server_lr="fast"), "server_lr"),
    ],
)
def test_a_key_or_value_it_cannot_honour_is_refused_by_name(change: Any, field: str, tmp_path: Path) -> None:
    data = copy.deepcopy(fedrevive())
    change(data)
    with pytest.raises(ConfigError, match=rf"^{field}:"):
        load_run_config(_write(tmp_path, "fedrevive", data), {"data_root": str(tmp_path)})


@pytest.mark.parametrize(
    ("model_name", "model"), [("convnet", "cnn"), ("ConvNet", "cnn"), ("resnet18", None), (None, None)]
)
def test_their_convnet_is_read_as_the_small_cnn_with_a_note(
    model_name: str | None, model: str | None, tmp_path: Path
) -> None:
    """Their FEMNIST ConvNet becomes fedqueue's cnn, said in a note; resnet18 (or none named) stays theirs."""
    data = {**fedbuff(), "model_name": model_name}
    config, notes = load_run_config_with_notes(_write(tmp_path, "fedbuff", data), {"data_root": str(tmp_path)})
    assert config.model == (model or "resnet18_fedrevive")
    noted = [note for note in notes if note.startswith("model_name:")]
    if model is None:
        assert noted == []
    else:
        assert len(noted) == 1 and noted[0].startswith("model_name: convnet is read as fedqueue's cnn")


def test_cifar100_reads_from_its_own_folder_and_rotates_too(tmp_path: Path) -> None:
    data = fedrevive()
    data["dataset"] = "cifar100"
    (tmp_path / "data" / "cifar100").mkdir(parents=True)
    config = load_run_config(
        _write(tmp_path / "data", "c100", data), {"data_root": str(tmp_path / "data" / "cifar100")}
    )
    assert (config.data.dataset, config.data.augment) == ("cifar100", "crop_flip_rotate")


def test_auto_learning_rates_resolve_as_theirs_do(tmp_path: Path) -> None:
    data = dd_fedrevive()
    data.update(server_lr="auto", local_learning_rate="auto")
    config = load_run_config(_write(tmp_path, "dd", data), {"data_root": str(tmp_path)})
    assert (config.global_lr, config.training.local_lr) == (0.2, 0.0003)


def test_check_prints_toml_that_run_reads_back_to_the_same_config(tmp_path: Path) -> None:
    path = _write(tmp_path, "fedrevive", fedrevive())
    printed = fedqueue_cli("check", str(path), "--set", f"data_root={tmp_path}", cwd=tmp_path, timeout=60)
    assert printed.returncode == 0, printed.stderr
    assert "note: gpu_id: ignored" in printed.stderr and "Traceback" not in printed.stderr
    kept = tmp_path / "kept.toml"
    kept.write_text(printed.stdout)
    assert load_run_config(kept) == load_run_config(path, {"data_root": str(tmp_path)})
    # The same TOML, with a comment on each key the file or --set gave.
    unmarked = re.sub(r"  # (--)?set$", "", printed.stdout, flags=re.MULTILINE).split("\n", 1)[1]
    assert config_toml(load_run_config(kept)) == unmarked.rstrip("\n") + "\n"
    refused = fedqueue_cli("check", str(_write(tmp_path, "bad", {**fedbuff(), "gpu": 1})), cwd=tmp_path, timeout=60)
    assert refused.returncode == 2 and refused.stderr.strip().splitlines()[-1].startswith("error: gpu:")


def test_a_plain_json_of_fedqueue_keys_reads_like_toml(tmp_path: Path) -> None:
    path = tmp_path / "plain.json"
    path.write_text(json.dumps({"rounds": 3, "devices_per_round": 4}))
    assert load_run_config(path) == RunConfig.from_dict({"rounds": 3, "devices_per_round": 4})


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_the_example_toml_is_their_file_resolved(name: str, tmp_path: Path) -> None:
    """examples/fedrevive/NAME.toml stays what `fedqueue check` makes of their NAME.json."""
    example = Path(__file__).resolve().parents[2] / "examples" / "fedrevive" / f"{name}.toml"
    here = {"data_root": str(tmp_path)}
    assert load_run_config(example, here) == load_run_config(_write(tmp_path, name, EXPECTED[name][0]()), here)


# What a small example (examples/fedrevive/small/) keeps of its experiment as it is, and what it scales.
KEPT: tuple[str, ...] = (
    "mode",
    "kd_augmentation",
    "buffer_size",
    "global_lr",
    "staleness_weight",
    "clock",
    "target_accuracy",
)
KEPT += ("local_iters", "local_batch_size", "local_optimizer", "local_lr", "partition", "alpha", "eval_every", "seed")
KEPT += ("download_delay", "localtrain_delay", "upload_delay", "kd_beta", "kd_iters", "kd_lr", "kd_temperature")


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_the_small_example_keeps_its_experiment_s_strategy_clock_and_stops(name: str, tmp_path: Path) -> None:
    """examples/fedrevive/small/NAME.toml: their strategy, weighting, clock and stop rules on 100 digits devices,
    20 at once, with every count of versions (and of staleness) a fifth of theirs."""
    folder = Path(__file__).resolve().parents[2] / "examples" / "fedrevive"
    full = load_run_config(folder / f"{name}.toml", {"data_root": str(tmp_path)})
    small = load_run_config(folder / "small" / f"{name}.toml")
    for key in KEPT:
        assert small.to_dict()[key] == full.to_dict()[key], key
    settings = small.strategy_settings
    # Devices at once: FedBuff's concurrency, a round's devices in synchronous rounds.
    at_once = settings.resolved_concurrency(small) if isinstance(settings, FedBuffSection) else small.devices_per_round
    assert (small.data.dataset, small.num_devices, at_once) == ("digits", 100, 20)
    bound = small.strategy_mode.bound
    assert small.to_dict()[bound] == full.to_dict()[bound] // 5
    assert small.early_stop == [{"version": 200, "accuracy": 0.15}] and small.max_sim_time == 40
    if isinstance(settings, FedBuffSection) and settings.staleness_weight == "afl_dw":
        assert small.strategy(FedBuffSection).staleness_s_max == full.strategy(FedBuffSection).staleness_s_max / 5
    if small.data_free:
        assert (
            small.strategy(FedReviveSection).kd_beta_factor,
            small.strategy(FedReviveSection).dfkd["freeze_rounds"],
            small.strategy(FedReviveSection).dfkd["warmup_rounds"],
        ) == (15, 10, 20)
