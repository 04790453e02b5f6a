"""FedRevive's own JSON experiment files, read as they are: each key becomes a fedqueue knob, a note, or a refusal.

Their loader merges a file's keys shallowly over its defaults (a settings block in the file replaces the
default block whole), resolves `"auto"` learning rates, and picks the settings block its `algorithm`
and `kd_augmentation` name. This module does the same, then names fedqueue's knob for every key;
docs/fedrevive-reference.md lists what each key means in their code. Pure: no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from fedqueue.errors import ConfigError, did_you_mean

# Their `"auto"` server learning rates for CIFAR-10, by what the run does (their Config.set_lr_values).
AUTO_SERVER_LR = {"sync": 1.4, "dfkd": 0.1, "simple_kd": 0.2, "none": 0.05}
AUTO_LOCAL_LR = 0.0003

# Keys that mean nothing here: where things run and what is logged is fedqueue's to decide.
IGNORED = {
    "log_dir": "fedqueue logs to its store and report",
    "out_dir": "results live in fedqueue's store; `fedqueue report RUN` writes files",
    "continue_exp_from": "a run goes on with `fedqueue resume RUN`",
    "save_exp_state_interval": "every version is checkpointed in the store",
    "save_model_interval": "every version is checkpointed in the store",
    "train_device": "workers own their devices, one GPU each",
    "model_device": "workers own their devices, one GPU each",
    "data_device": "workers own their devices, one GPU each",
    "gpu_id": "workers own their GPUs (`fedqueue worker --gpus`)",
    "wandb_flag": "TensorBoard files are written where tensorboard_dir (or --tensorboard DIR) says",
    "wandb_entity": "no W&B logging",
    "wandb_project": "no W&B logging",
    "wandb_run_name": "the run's name is the file's stem",
    "wandb_group": "no W&B logging",
    "save_plot": "`fedqueue report RUN` draws the accuracy curves",
    "eval_batch_size": "evaluation batches are fedqueue's own; results do not depend on them",
    "test_split": "unused for CIFAR in their code too; the official test split is used",
    "external_kd_dataset": None,  # refused when set (below); accepted when null
    "pretrained_model_path": None,
}


@dataclass
class Translation:
    """A fedqueue run config (as raw keys) and one note per key that means nothing here."""

    raw: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    # Their key behind each fedqueue key copied as it is, so RunConfig's refusal names the key in their file.
    origins: dict[str, str] = field(default_factory=dict)


def is_fedrevive_json(data: Mapping[str, Any]) -> bool:
    """A JSON object that looks like their experiment file (their names, not fedqueue's)."""
    return "algorithm" in data or "num_clients" in data or "async_fl_settings" in data


def translate(data: Mapping[str, Any], name: str = "") -> Translation:
    """Their experiment file as fedqueue knobs; a key with no counterpart is refused by name."""
    out = Translation()
    raw = out.raw
    if name:
        raw["name"] = name
    algorithm = _choice(data, "algorithm", ("sync_fl", "async_fl"), "sync_fl")
    kd = data.get("kd_augmentation")
    if kd is not None and kd not in ("dfkd", "simple_kd"):
        raise ConfigError(f"kd_augmentation: unknown value {_shown(kd)} (their code knows null, dfkd and simple_kd)")
    downweighting = _bool(data, "async_downweighting", False)
    handled: set[str] = {"algorithm", "kd_augmentation", "async_downweighting"}

    def take(key: str, to: str, convert: Callable[[str, Any], Any]) -> None:
        handled.add(key)
        if key in data:
            raw[to] = convert(key, data[key])
            out.origins[to] = key

    take("setup_random_seed", "seed", _whole)
    handled.add("run_random_seed")
    if data.get("run_random_seed", data.get("setup_random_seed")) != data.get("setup_random_seed"):
        out.notes.append("run_random_seed: fedqueue draws everything from one seed, setup_random_seed")
    take("num_clients", "num_devices", _whole)
    take("local_batch_size", "local_batch_size", _whole)
    take("local_iters", "local_iters", _whole)
    take("local_optimizer", "local_optimizer", _text)
    take("local_momentum", "local_momentum", _real)
    take("eval_interval", "eval_every", _whole)
    take("dirichlet_alpha", "alpha", _real)
    take("kd_split", "kd_split", _real)
    handled.add("local_learning_rate")
    local_lr = data.get("local_learning_rate", AUTO_LOCAL_LR)
    raw["local_lr"] = AUTO_LOCAL_LR if local_lr == "auto" else _number("local_learning_rate", local_lr)
    _stops(data, raw, handled)
    _dataset(data, raw, handled, out.notes)
    _partition(data, raw, handled)

    _block(data, "sync_fl_settings"), _block(data, "async_fl_settings")  # the unused one is an object too
    if algorithm == "sync_fl":
        raw["mode"] = "fedavg"
        settings = _block(data, "sync_fl_settings")
        raw["devices_per_round"] = _whole("sync_fl_settings.nb_of_active_jobs", settings.get("nb_of_active_jobs", 100))
        out.origins["devices_per_round"] = "sync_fl_settings.nb_of_active_jobs"
        handled |= {"sync_fl_settings", "async_fl_settings"}
        server_lr_rule = "sync"
    else:
        settings = _block(data, "async_fl_settings")
        raw["concurrency"] = _whole("async_fl_settings.nb_of_active_jobs", settings.get("nb_of_active_jobs", 100))
        raw["buffer_size"] = _whole("async_fl_settings.buffer_size", settings.get("buffer_size", 1))
        out.origins.update(
            concurrency="async_fl_settings.nb_of_active_jobs", buffer_size="async_fl_settings.buffer_size"
        )
        handled |= {"sync_fl_settings", "async_fl_settings"}
        raw["mode"] = "fedbuff" if kd is None else "fedrevive"
        server_lr_rule = kd or "none"
        if kd is not None:
            raw["kd_augmentation"] = kd
    handled.add("server_lr")
    server_lr = data.get("server_lr", "auto")
    raw["global_lr"] = AUTO_SERVER_LR[server_lr_rule] if server_lr == "auto" else _number("server_lr", server_lr)

    _kd_settings(data, raw, kd, downweighting, algorithm, handled, out.notes, out.origins)
    _clock(data, raw, handled)
    out.origins.update(local_lr="local_learning_rate", global_lr="server_lr", max_sim_time="max_wait_time")
    for key, why in IGNORED.items():
        handled.add(key)
        if key not in data:
            continue
        if why is None:
            if data[key] is not None:
                raise ConfigError(f"{key}: {data[key]!r} is not supported here (only null)")
            continue
        out.notes.append(f"{key}: ignored: {why}")
    unknown = [key for key in data if key not in handled]
    if unknown:
        hint = did_you_mean(unknown[0], handled)
        raise ConfigError(f"{unknown[0]}: not a FedRevive key fedqueue knows (from their config.py){hint}")
    return out


def _stops(data: Mapping[str, Any], raw: dict[str, Any], handled: set[str]) -> None:
    """Their stop rules; a value of 0 or less turns one off, as in their config."""
    handled |= {"max_wait_time", "target_accuracy", "max_rounds", "early_stop"}
    for key, to in (("max_wait_time", "max_sim_time"), ("target_accuracy", "target_accuracy")):
        value = data.get(key)
        if value is not None and _number(key, value) > 0:
            raw[to] = float(value)
    rounds = data.get("max_rounds")
    if rounds is not None and _whole("max_rounds", rounds) > 0:
        raw["max_rounds"] = rounds
    floors = data.get("early_stop") or []
    if not isinstance(floors, list) or not all(isinstance(floor, Mapping) for floor in floors):
        raise ConfigError(f"early_stop: expected a list of {{round, acc}} objects, got {_shown(floors)}")
    try:
        raw["early_stop"] = [
            {"version": _whole("early_stop.round", floor["round"]), "accuracy": _real("early_stop.acc", floor["acc"])}
            for floor in floors
        ]
    except KeyError as missing:
        raise ConfigError(f"early_stop: each entry needs round and acc, one lacks {missing}") from None
    if not raw["early_stop"]:
        del raw["early_stop"]


def _dataset(data: Mapping[str, Any], raw: dict[str, Any], handled: set[str], notes: list[str]) -> None:
    handled |= {"dataset", "val_split", "model_name"}
    dataset = data.get("dataset", "cifar10")
    if dataset in ("femnist", "news"):
        raise ConfigError(
            f"dataset: {dataset!r} has no offline loader here (fedqueue reads cifar10 and cifar100 from data_root)"
        )
    if dataset not in ("cifar10", "cifar100"):
        raise ConfigError(f"dataset: {dataset!r} is not one of their datasets fedqueue reads (cifar10, cifar100)")
    raw["dataset"] = dataset
    raw["data_root"] = f"data/{dataset}"  # torchvision's layout under it; `--set data_root=...` names another
    # Their clients crop (4 px of zero padding) and flip; CIFAR-100's rotate up to 15 degrees too.
    raw["augment"] = "crop_flip_rotate" if dataset == "cifar100" else "crop_flip"
    if "val_split" in data:
        raw["val_split"] = _number("val_split", data["val_split"])
    model = data.get("model_name") or "resnet18"  # null: their default for cifar10 and cifar100
    if not isinstance(model, str) or model.lower() not in MODELS:
        raise ConfigError(f"model_name: {model!r} is not supported ({', '.join(MODELS)} are)")
    raw["model"] = MODELS[model.lower()]  # their create_model reads the name in lower case
    if model.lower() == "convnet":
        notes.append(CONVNET_NOTE)


# Their model names, and fedqueue's model for each.
MODELS = {
    "resnet18": "resnet18_fedrevive",  # theirs: no BatchNorm, stat trackers instead
    "convnet": "cnn",
}
CONVNET_NOTE = (
    "model_name: convnet is read as fedqueue's cnn (two convolutions of 32 and 64 channels, no stat trackers):"
    " theirs is FEMNIST's ConvNet (three 64-channel convolutions with stat trackers, 1x28x28 inputs only),"
    " so the data-free synthesis has no feature statistics to match with it"
)


def _partition(data: Mapping[str, Any], raw: dict[str, Any], handled: set[str]) -> None:
    handled |= {"data_distribution", "client_data_size"}
    distribution = data.get("data_distribution", "non_iid_dirichlet")
    if distribution != "non_iid_dirichlet":
        raise ConfigError(f"data_distribution: {distribution!r} is not supported (non_iid_dirichlet is)")
    raw["partition"] = "dirichlet_fixed"  # exactly client_data_size samples a device, shards overlapping
    raw["client_data_size"] = _whole("client_data_size", data.get("client_data_size", 350))


def _kd_settings(
    data: Mapping[str, Any],
    raw: dict[str, Any],
    kd: str | None,
    downweighting: bool,
    algorithm: str,
    handled: set[str],
    notes: list[str],
    origins: dict[str, str],
) -> None:
    handled |= {"simple_kd_settings", "dfkd_settings"}
    simple, dfkd = _block(data, "simple_kd_settings"), _block(data, "dfkd_settings")
    if downweighting:
        if algorithm != "async_fl" or kd is not None:
            raise ConfigError("async_downweighting: only with algorithm async_fl and no kd_augmentation")
        if dfkd.get("beta", "cosine") not in ("cosine", "adaptive"):
            raise ConfigError(
                f"dfkd_settings.beta: {dfkd.get('beta')!r} with async_downweighting = true,"
                ' whose AFL-DW follows the cosine schedule here ("cosine")'
            )
        raw["staleness_weight"] = "afl_dw"
        raw["staleness_s_max"] = _real("dfkd_settings.adaptive_beta_factor", dfkd.get("adaptive_beta_factor", 75))
        origins["staleness_s_max"] = "dfkd_settings.adaptive_beta_factor"  # its refusals name their key
    if kd == "simple_kd":
        for flag in ("weighted_avg", "weighted_class_loss"):
            if simple.get(flag):
                raise ConfigError(f"simple_kd_settings.{flag}: true is not supported (false is)")
        origins.update(_copy(simple, raw, "simple_kd_settings", SIMPLE_KD_KEYS))
    elif kd == "dfkd":
        unknown = [key for key in dfkd if key not in {**DFKD_KD_KEYS, **DFKD_TABLE_KEYS, **DFKD_INERT_KEYS}]
        if unknown:
            raise ConfigError(f"dfkd_settings.{unknown[0]}: not a FedRevive key fedqueue knows")
        kd_keys = {key: value for key, value in dfkd.items() if key in DFKD_KD_KEYS}
        origins.update(_copy(kd_keys, raw, "dfkd_settings", DFKD_KD_KEYS))
        raw["dfkd"] = {to: dfkd[key] for key, to in DFKD_TABLE_KEYS.items() if dfkd.get(key) is not None}
        origins.update({f"dfkd.{to}": f"dfkd_settings.{key}" for key, to in DFKD_TABLE_KEYS.items()})
        notes += [f"dfkd_settings.{key}: ignored: {why}" for key, why in DFKD_INERT_KEYS.items() if key in dfkd]
    unused = {"simple_kd_settings": kd != "simple_kd", "dfkd_settings": kd != "dfkd" and not downweighting}
    notes += [
        f"{block}: ignored (this run does not use it)" for block, idle in unused.items() if idle and block in data
    ]


SIMPLE_KD_KEYS = {
    "learning_rate": "kd_lr",
    "nb_of_iters": "kd_iters",
    "batch_size": "kd_batch_size",
    "beta": "kd_beta",
    "adaptive_beta_factor": "kd_beta_factor",
    "temperature": "kd_temperature",
    "kd_buffer_size": "kd_buffer_size",
    "kd_version": "kd_version",
    "weighted_avg": None,
    "weighted_class_loss": None,
}
DFKD_KD_KEYS = {
    "beta": "kd_beta",
    "adaptive_beta_factor": "kd_beta_factor",
    "kd_buffer_size": "kd_buffer_size",
    "kd_nb_of_iters": "kd_iters",
    "kd_batch_size": "kd_batch_size",
    "lr": "kd_lr",
    "T": "kd_temperature",
}
DFKD_TABLE_KEYS = {
    "freeze_rounds": "freeze_rounds",
    "warmup_rounds": "warmup_rounds",
    "synth_batch_size": "synth_batch_size",
    "nz": "nz",
    "ngf": "ngf",
    "g_steps": "g_steps",
    "lr_g": "lr_g",
    "lr_z": "lr_z",
    "adv": "adv",
    "bn": "bn",
    "oh": "oh",
    "class_embedding_weight": "class_embedding_weight",
    "max_images": "pool_size",
}
DFKD_INERT_KEYS = {
    "vis_freq": "no image grids are saved",
    "reset_l0": "stored but never applied in their code",
    "is_maml": "fedqueue's meta step is Reptile, their default",
    "bn_mmt": "0 in every sample file: the teachers' own statistics are matched",
    "kl_uniform": "weight 0 in every sample file",
    "diversity_loss_weight": "weight 0 in every sample file",
    "batch_size": "read by nothing in their code (synth_batch_size is)",
}


def _copy(block: Mapping[str, Any], raw: dict[str, Any], where: str, names: Mapping[str, str | None]) -> dict[str, str]:
    """Copy a block's keys to fedqueue's (RunConfig checks their values); returns their key behind each."""
    origins = {}
    for key, value in block.items():
        if key not in names:
            raise ConfigError(f"{where}.{key}: not a FedRevive key fedqueue knows")
        to = names[key]
        if to is not None and value is not None:
            raw[to] = value
            origins[to] = f"{where}.{key}"
    return origins


CLOCK_PHASES = ("download_delay", "localtrain_delay", "upload_delay")


def _clock(data: Mapping[str, Any], raw: dict[str, Any], handled: set[str]) -> None:
    handled.update(CLOCK_PHASES)
    raw["clock"] = "fedrevive"
    for phase in CLOCK_PHASES:
        if phase in data:
            raw[phase] = dict(_block(data, phase))


def _block(data: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    value = data.get(key)
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ConfigError(f"{key}: expected an object, got {_shown(value)}")
    return value


def _choice(data: Mapping[str, Any], key: str, choices: tuple[str, ...], default: str) -> str:
    value = data.get(key, default)
    if not isinstance(value, str) or value not in choices:
        raise ConfigError(f"{key}: unknown value {_shown(value)} (their code knows {', '.join(choices)})")
    return value


def _bool(data: Mapping[str, Any], key: str, default: bool) -> bool:
    value = data.get(key, default)
    if not isinstance(value, bool):
        raise ConfigError(f"{key}: expected true or false, got {_shown(value)}")
    return value


def _number(key: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ConfigError(f'{key}: expected a number or "auto", got {_shown(value)}')
    return float(value)


# Each value's type is checked as their file gives it: a float or a bool is never cast to an integer.


def _whole(key: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{key}: expected an integer, got {_shown(value)}")
    return value


def _real(key: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ConfigError(f"{key}: expected a number, got {_shown(value)}")
    return float(value)


def _text(key: str, value: Any) -> str:
    if not isinstance(value, str):
        raise ConfigError(f"{key}: expected a string, got {_shown(value)}")
    return value


def _shown(value: Any) -> str:
    """A value as their JSON wrote it, short: null, true, a list, an object, or the value itself."""
    if value is None or isinstance(value, bool):
        return "null" if value is None else str(value).lower()
    if isinstance(value, list | Mapping):
        return "a list" if isinstance(value, list) else "an object"
    shown = repr(value)
    return shown if len(shown) <= 60 else f"{shown[:57]}..."
