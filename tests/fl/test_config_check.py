"""`fedqueue check` as a user porting a config meets it: their files shown before the data is there, the keys they
set marked, the rules that stop a run early named, misspelt keys and FLARE's names answered in one line, every
example accepted; and the data as their code normalises it."""

from __future__ import annotations

import json
import pickle
import re
import shlex
import tomllib
from pathlib import Path
from typing import Any

import pytest
import torch
from typer.testing import CliRunner

from fedqueue.errors import ConfigError
from fedqueue.fl.cli import app
from fedqueue.fl.config import RunConfig, config_toml, load_run_config, parse_override, read_run_config
from fedqueue.fl.config_files.explain import marked_toml
from fedqueue.fl.ml.augment import augment_batch, augment_generator, augmentation
from fedqueue.fl.ml.cifar_fixture import write_cifar100_files, write_cifar_batches
from fedqueue.fl.ml.data import DataSpec, clear_caches, load_federated
from fedqueue.fl.strategy.fedbuff.section import FedBuffSection
from fedqueue.fl.strategy.fedrevive.section import FedReviveSection
from tests.fl.test_fedrevive_json import fedrevive
from tests.support.cli_runner import fedqueue_cli

REPO = Path(__file__).resolve().parents[2]

# FedRevive's DataTransformManager.DATASET_SPECS (their simulator's utils/data_utils.py), as written there.
THEIR_MEAN = {"cifar10": (0.4914, 0.4822, 0.4465), "cifar100": (0.507, 0.487, 0.441)}
THEIR_STD = {"cifar10": (0.2023, 0.1994, 0.2010), "cifar100": (0.268, 0.257, 0.276)}


def _raw_pixels(path: Path) -> torch.Tensor:
    with path.open("rb") as handle:
        entry = pickle.load(handle, encoding="latin1")
    return torch.from_numpy(entry["data"]).view(-1, 3, 32, 32).float() / 255.0


@pytest.mark.parametrize("dataset", ["cifar10", "cifar100"])
def test_both_cifars_are_normalised_with_their_constants(dataset: str, tmp_path: Path) -> None:
    clear_caches()
    if dataset == "cifar10":
        test_file = write_cifar_batches(tmp_path, train_samples=20, test_samples=7) / "test_batch"
    else:
        test_file = write_cifar100_files(tmp_path, train_samples=20, test_samples=7) / "test"
    loaded = load_federated(DataSpec(dataset, root=str(tmp_path), num_devices=2)).test.x
    mean = torch.tensor(THEIR_MEAN[dataset]).view(1, 3, 1, 1)
    std = torch.tensor(THEIR_STD[dataset]).view(1, 3, 1, 1)
    assert torch.allclose(loaded, (_raw_pixels(test_file) - mean) / std, atol=1e-5)


def _their_file(tmp_path: Path, dataset: str) -> Path:
    data = fedrevive()
    data["dataset"] = dataset
    path = tmp_path / f"{dataset}_fedrevive.json"
    path.write_text(json.dumps(data))
    return path


@pytest.mark.parametrize("dataset", ["cifar10", "cifar100"])
def test_check_prints_their_file_with_no_data_folder_and_run_refuses_it(dataset: str, tmp_path: Path) -> None:
    path = _their_file(tmp_path, dataset)
    checked = fedqueue_cli("check", str(path), "--set", "seed=3", cwd=tmp_path)
    assert checked.returncode == 0, checked.stderr
    assert "Traceback" not in checked.stderr
    printed = tomllib.loads(checked.stdout)
    assert (printed["dataset"], printed["data_root"], printed["seed"]) == (dataset, f"data/{dataset}", 3)
    folder = {"cifar10": "cifar-10-batches-py", "cifar100": "cifar-100-python"}[dataset]
    assert checked.stderr.strip().splitlines()[-1] == (
        f"warning: data_root: dataset root 'data/{dataset}' does not exist here; `fedqueue run` refuses this config"
        f" until it holds {folder}/ (or --set data_root=FOLDER names another)"
    )
    # Who set what: the file's keys, the command line's, and defaults unmarked.
    lines = checked.stdout.splitlines()
    assert f'dataset = "{dataset}"  # set' in lines and "seed = 3  # --set" in lines
    assert 'local_step = "cross_entropy"' in lines and "max_model_version = 50000  # set" in lines
    # Their stop rules, each named, and how to run their table.
    stops = checked.stderr[checked.stderr.index("these keys stop the run early:") :]
    for rule in ("max_rounds = 50000", "max_sim_time = 17500", "target_accuracy = 0.85", "early_stop: "):
        assert f"\n  {rule}" in stops, rule
    assert "--set target_accuracy=none --set early_stop=[]" in stops and "max_sim_time=200" in stops

    refused = fedqueue_cli("run", str(path), cwd=tmp_path)
    assert refused.returncode == 2
    assert refused.stderr.strip() == f"error: data_root: dataset root 'data/{dataset}' does not exist"
    assert not (tmp_path / "fedqueue.db").exists()


def test_the_marked_toml_reads_back_to_the_same_config(tmp_path: Path) -> None:
    path = _their_file(tmp_path, "cifar10")
    loaded = read_run_config(path, {"seed": 4, "max_sim_time": 200.0}, check_data=False)
    text = marked_toml(loaded)
    assert RunConfig.from_dict(tomllib.loads(text), check_data=False) == loaded.config
    assert "max_sim_time = 200.0  # --set" in text.splitlines()
    assert "[dfkd]  # set" in text.splitlines() and "nz = 256" in text.splitlines()  # a table's keys: its header
    unmarked = re.sub(r"  # (--)?set$", "", text, flags=re.MULTILINE).split("\n", 1)[1]
    assert unmarked == config_toml(loaded.config)


def test_their_table_s_overrides_unset_the_stop_rules(tmp_path: Path) -> None:
    sets = ["max_sim_time=100", "target_accuracy=none", "early_stop=[]", "max_rounds=none"]
    config = load_run_config(
        _their_file(tmp_path, "cifar10"), dict(parse_override(item) for item in sets) | {"data_root": str(tmp_path)}
    )
    assert (config.target_accuracy, config.early_stop, config.max_rounds) == (None, [], None)
    assert config.last_version is None and config.max_sim_time == 100  # bounded by simulated time alone
    assert parse_override("augment=none") == ("augment", "none")  # the word, where a knob takes it


@pytest.mark.parametrize(
    ("raw", "line"),
    [
        ({"rouds": 3}, "rouds: unknown setting; did you mean 'rounds'?"),
        ({"colour": "red"}, "colour: unknown setting (every knob: docs/reference/run-config.md)"),
        ({"device_selection_size": 20}, "device_selection_size: FLARE's name; fedqueue's is concurrency"),
        ({"num_updates_for_model": 5}, "num_updates_for_model: FLARE's name; fedqueue's is buffer_size"),
        ({"staleness_weight": True}, 'staleness_weight: FLARE\'s true is "flare_sqrt" here'),
        (
            {"const_selection": True},
            "const_selection: FLARE's flag to train the same devices every version is num_devices = concurrency"
            " here (with device_reuse = true); false, FLARE's default, is what fedqueue always does: remove the key",
        ),
        (
            {"clock": "fedrevive", "upload_delay": {"typ": "constant"}},
            "upload_delay: unknown setting 'typ'; did you mean 'type'?",
        ),
        (
            {"mode": "fedrevive", "kd_augmentation": "dfkd", "dfkd": {"freze_rounds": 5}},
            "dfkd: unknown setting 'freze_rounds'; did you mean 'freeze_rounds'?",
        ),
    ],
)
def test_a_key_not_known_is_one_line_with_what_was_meant(raw: dict[str, Any], line: str) -> None:
    with pytest.raises(ConfigError) as refused:
        RunConfig.from_dict(raw)
    assert str(refused.value) == line


def test_a_misspelt_key_in_their_json_says_what_was_meant(tmp_path: Path) -> None:
    data = fedrevive()
    data["num_client"] = data.pop("num_clients")
    path = tmp_path / "fedrevive.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ConfigError) as refused:
        load_run_config(path)
    assert str(refused.value) == (
        "num_client: not a FedRevive key fedqueue knows (from their config.py); did you mean 'num_clients'?"
    )


def test_set_mistakes_are_one_line_exit_2(tmp_path: Path) -> None:
    example = str(REPO / "examples" / "digits_fedavg.toml")
    spaced = fedqueue_cli("check", example, "--set", "rounds", "3", cwd=tmp_path)
    assert spaced.returncode == 2 and spaced.stdout == ""
    assert spaced.stderr == (
        "error: --set expects KEY=VALUE, got 'rounds' (no spaces around '=': --set rounds=VALUE)\n"
    )
    misspelt = fedqueue_cli("run", example, "--set", "rouds=3", cwd=tmp_path)
    assert misspelt.returncode == 2
    assert misspelt.stderr == "error: --set rouds: unknown setting; did you mean 'rounds'?\n"
    assert not (tmp_path / "fedqueue.db").exists()


@pytest.mark.parametrize(
    ("overrides", "shape"), [({"augment": "crop_flip_rotate"}, "1x8x8"), ({"augment": "crop_flip"}, "1x8x8")]
)
def test_an_augmentation_for_32x32_images_is_refused_on_the_digits(overrides: dict[str, Any], shape: str) -> None:
    with pytest.raises(ConfigError) as refused:
        RunConfig.from_dict({"dataset": "digits", **overrides})
    assert str(refused.value) == (
        f"augment: \"{overrides['augment']}\" crops 32x32 images padded by 4 pixels; dataset 'digits' has {shape}"
        ' images (set augment = "none")'
    )
    assert RunConfig.from_dict({"dataset": "synthetic", **overrides}).data.augment == overrides["augment"]


@pytest.mark.parametrize("shape", [(4, 1, 8, 8), (4, 64), (4, 3, 28, 28)])
def test_a_plugin_dataset_s_other_images_are_refused_when_augmented(shape: tuple[int, ...]) -> None:
    """A dataset whose shape the config cannot know (a plugin's) is refused where a device augments its batch."""
    aug = augmentation("crop_flip")
    assert aug is not None
    with pytest.raises(ConfigError, match=r"^augment: crops 32x32 images padded by 4 pixels; the dataset's are "):
        augment_batch(aug, torch.zeros(shape), augment_generator(0))
    assert augment_batch(aug, torch.zeros(4, 3, 32, 32), augment_generator(0)).shape == (4, 3, 32, 32)


def _recipe() -> list[str]:
    """The command line docs/fl/coming-from.md gives to shrink one's own FedRevive file."""
    page = (REPO / "docs" / "fl" / "coming-from.md").read_text()
    block = page.split("<!-- shrink-recipe -->\n```\n", 1)[1].split("```", 1)[0]
    return shlex.split(block.replace("\\\n", " "))


def test_the_shrink_recipe_checks(tmp_path: Path) -> None:
    words = _recipe()
    assert words[:3] == ["fedqueue", "check", "fedrevive.json"]
    (tmp_path / "fedrevive.json").write_text(json.dumps(fedrevive()))
    checked = fedqueue_cli(*words[1:], cwd=tmp_path)
    assert checked.returncode == 0, checked.stderr
    assert "warning" not in checked.stderr  # the digits need no data folder
    config = RunConfig.from_dict(tomllib.loads(checked.stdout))
    data = config.data
    assert (data.dataset, config.model, data.augment, config.num_devices) == ("digits", "mlp", "none", 100)
    assert (
        config.data_free
        and config.strategy(FedReviveSection).dfkd["freeze_rounds"] == 10
        and config.max_model_version == 10000
    )
    # Without augment=none, the digits are refused by name.
    at = words.index("augment=none")
    refused = fedqueue_cli(*words[1 : at - 1], *words[at + 1 :], cwd=tmp_path)
    assert refused.returncode == 2 and refused.stderr.startswith('error: augment: "crop_flip" crops 32x32 images')


def _examples() -> list[Path]:
    return sorted(path for path in (REPO / "examples").rglob("*.toml") if "plugins" not in path.parts)


@pytest.mark.parametrize("path", _examples(), ids=lambda path: str(path.relative_to(REPO / "examples")))
def test_every_example_is_accepted_by_check(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)  # where the examples' data_root (data/...) is meant
    result = CliRunner().invoke(app, ["check", str(path)])
    assert result.exit_code == 0, result.output
    assert (
        RunConfig.from_dict(tomllib.loads(result.stdout), check_data=False)
        == read_run_config(path, check_data=False).config
    )


def test_the_flare_example_is_flare_s_recipe_in_fedqueue_s_names() -> None:
    config = load_run_config(REPO / "examples" / "flare_fedbuff.toml")
    assert (config.mode, config.timing.clock, config.strategy(FedBuffSection).staleness_weight) == (
        "fedbuff",
        "flare",
        "flare_sqrt",
    )
    assert (
        config.strategy(FedBuffSection).concurrency,
        config.strategy(FedBuffSection).buffer_size,
        config.strategy(FedBuffSection).min_refill,
        config.strategy(FedBuffSection).max_staleness,
    ) == (20, 10, 1, 9)
    assert config.max_model_version == 20 - 1 and config.timing.device_speed["mean"] == [100.0, 200.0, 400.0]
