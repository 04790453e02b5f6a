"""The run config: a TOML file of FL knobs, overridable from the command line.

Everything is validated here, before anything is written anywhere; each error
is one line that names the field at fault.
"""

from __future__ import annotations

import dataclasses
import json
import tomllib
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from fedqueue.errors import ConfigError, DataError, did_you_mean
from fedqueue.fl.clock.section import ClockSection
from fedqueue.fl.clock.stops import StopRules, check_stop_rules
from fedqueue.fl.config_files import ConfigFile, read_config_file
from fedqueue.fl.ml.data_section import DataSection
from fedqueue.fl.ml.plugins import describe_choices, is_valid_name
from fedqueue.fl.ml.train_section import TrainingSection
from fedqueue.fl.packs.section import PackSection
from fedqueue.fl.sections.base import (
    SECTION,
    KeyType,
    Section,
    check_type,
    choice,
    default_of,
    key_types,
    own_keys,
    positive,
)
from fedqueue.fl.strategy.fedrevive.section import FedReviveSection
from fedqueue.fl.strategy.mode import Mode
from fedqueue.fl.strategy.modes import MODES as STRATEGY_MODES
from fedqueue.store.schema import NAME_MAX

FAILURE_POLICIES = ("skip", "abort")
MODES = tuple(STRATEGY_MODES)

# FLARE's edge FedBuff names (its recipe's ModelManagerConfig, DeviceManagerConfig, SimulationConfig): a config
# written with them is told fedqueue's knob, or why there is none, instead of "unknown setting".
FLARE_NAMES = {
    "num_updates_for_model": "FLARE's name; fedqueue's is buffer_size",
    "device_selection_size": "FLARE's name; fedqueue's is concurrency",
    "min_hole_to_fill": "FLARE's name; fedqueue's is min_refill",
    "max_model_history": "FLARE's name; its max_model_history = H is max_staleness = H - 1 here",
    "const_selection": "FLARE's flag to train the same devices every version is num_devices = concurrency here"
    " (with device_reuse = true); false, FLARE's default, is what fedqueue always does: remove the key",
    "device_sampling_strategy": "FLARE balances devices over its leaf clients; fedqueue has no leaves and draws"
    ' free devices uniformly (FLARE\'s "random"): remove the key',
    "max_num_active_model_versions": "FLARE's leaf clients keep that many versions; fedqueue keeps every version"
    " in its store: remove the key",
    "update_timeout": "FLARE waits that long on the wall clock for updates; fedqueue folds them in simulated order"
    " and never waits on a timer: remove the key",
    "initial_min_client_num": "FLARE waits for that many leaf clients; fedqueue starts with the workers it has:"
    " remove the key",
    "job_timeout": "FLARE's wall-clock limit; fedqueue bounds a run by max_model_version or max_sim_time",
    "eval_frequency": "FLARE's name; fedqueue's is eval_every",
    "num_workers": "FLARE's simulator processes; fedqueue's are its workers (fedqueue run --procs N)",
}


@dataclass(frozen=True)
class RunConfig:
    """One FL experiment. Names follow what FL simulators already call these knobs."""

    name: str = ""
    """Label shown by `fedqueue runs`."""
    # The dataset, its split over the devices and its augmentation, in the data's section (fl/ml/data_section.py).
    data: DataSection = field(default_factory=DataSection, metadata=SECTION)
    model: str = "mlp"
    """`mlp`, `cnn` (the small CIFAR CNN), `resnet18` (torchvision's), `resnet18_fedrevive` (FedRevive's, without
    BatchNorm), or a plugin."""
    num_devices: int = 100
    """Simulated devices: the population each round selects from."""
    devices_per_round: int = 20
    """Devices selected each round (drawn from `seed` and the round)."""
    rounds: int = 10
    """Synchronous rounds to run; in the buffered modes, the default of `max_model_version`."""
    # How each device trains its update, in local training's section (fl/ml/train_section.py).
    training: TrainingSection = field(default_factory=TrainingSection, metadata=SECTION)
    global_lr: float = 1.0
    """Server learning rate: the step along the averaged update (in the buffered modes, the weighted mean update)."""
    eval_every: int = 1
    """Evaluate the global model on held-out data every N rounds (or versions), and after the last."""
    seed: int = 0
    """Seeds the model, the partition, the selection and every local training: the same seed gives the same
    weights, whatever the workers."""
    # A device that fails every attempt: "skip" aggregates the others (if at least
    # min_devices_per_round succeeded), "abort" fails the run.
    on_failure: str = "skip"
    """A device that failed every attempt: `skip` it and aggregate the others (at least `min_devices_per_round`),
    or `abort` the run."""
    min_devices_per_round: int = 1
    """Fewest successful devices a round may aggregate."""
    # When a run stops besides its last round or version (FedRevive's stop rules, fl/clock/stops.py): simulated
    # seconds (their max_wait_time), an accuracy to reach, and [{version, accuracy}] floors on the best
    # accuracy so far. max_rounds is their name for the aggregations a run makes: it sets `rounds`
    # (fedavg) or `max_model_version` (fedbuff, fedrevive).
    max_sim_time: float | None = None
    """Stop once this many simulated seconds have passed (FedRevive's `max_wait_time`): an update that would
    arrive at or after it is not taken."""
    target_accuracy: float | None = None
    """Stop once an evaluation reaches this accuracy."""
    early_stop: list[dict[str, Any]] = field(default_factory=list)
    """`[{version = N, accuracy = A}, ...]`: stop at version N if the best accuracy so far is at most A (N a
    multiple of `eval_every`)."""
    max_rounds: int | None = None
    """FedRevive's name for the versions a run makes: sets `rounds` (`fedavg`) or `max_model_version` (the
    buffered modes)."""
    # Devices per task and how a task trains them, in packing's section (fl/packs/section.py).
    packing: PackSection = field(default_factory=PackSection, metadata=SECTION)
    # How updates become versions: a strategy per mode, each in its folder of fl/strategy/.
    mode: str = "fedavg"
    """How updates become versions: `fedavg` (synchronous rounds), `fedbuff` (buffered asynchronous), `fedrevive`
    (FedBuff whose stale updates are mixed with a distilled one) or `fedasync` (each update mixed in as it
    arrives)."""
    max_model_version: int | None = None
    """Buffered modes: the run ends when this version is made (none: `rounds`; version 0 is the initial model)."""
    # FedRevive's held-out share: its server distils on it, and its fixed shards (dirichlet_fixed) leave it out in
    # every mode, as their data split does; a run key, as the strategy and the data section both read it.
    kd_split: float = 0.1
    """FedRevive: share of the training set the server holds out to distil on (`simple_kd`); no device gets it."""
    # How a simulated trip is timed: its keys (clock, device_speed, ...) in the clock's section (fl/clock/section.py).
    timing: ClockSection = field(default_factory=ClockSection, metadata=SECTION)
    # Free-form settings handed to the plugins (the TOML `[plugin]` table).
    plugin: dict[str, Any] = field(default_factory=dict)
    """Free-form settings handed to every plugin (the TOML `[plugin]` table)."""
    # Written by the process that follows the run (`fedqueue run`, `fedqueue resume`, `fedqueue.run()`),
    # from the store, as each round or version is made (fl/view/tensorboard.py).
    tensorboard_dir: str | None = None
    """A folder for TensorBoard event files (`tensorboard --logdir` it): each run writes under a folder of its
    own id, one step per round or version, with FedRevive's names (`test/accuracy`, `test/loss`, `test/time`
    (simulated time), `label_wise/accuracy_i` and `loss_i`, `train/loss`, `aggregation/avg_staleness`) and
    fedqueue's own under `fedqueue/`; `--tensorboard DIR` sets it. None: no files."""
    # The keys only the run's strategy reads, in its own section (its Mode's, fl/strategy/mode.py): written flat
    # in the file and in the store like every key, held here as the mode's frozen dataclass.
    strategy_settings: Section | None = field(default=None, metadata=SECTION)

    def __post_init__(self) -> None:
        mode = STRATEGY_MODES.get(self.mode)
        if self.strategy_settings is None and mode is not None and mode.section is not None:
            object.__setattr__(self, "strategy_settings", mode.section())

    def strategy(self, kind: type[S]) -> S:
        """The run's strategy section as `kind`, for the strategy that knows its mode has one."""
        if not isinstance(self.strategy_settings, kind):
            raise TypeError(f"mode = {self.mode!r} has no {kind.__name__}")
        return self.strategy_settings

    def with_keys(self, **changes: Any) -> RunConfig:
        """This config with some flat keys changed, each in its section; not checked again (`from_dict` checks)."""
        strategy_keys = _fields_of(self.strategy_settings)
        unknown = [
            key for key in changes if key not in _KEY_TYPES or (key in _STRATEGY_KEYS and key not in strategy_keys)
        ]
        if unknown:
            raise TypeError(f"mode = {self.mode!r} has no key {unknown[0]!r}")
        shared = {
            name: dataclasses.replace(getattr(self, name), **_keys_of(name, changes))
            for name in _SHARED_SECTIONS
            if _keys_of(name, changes)
        }
        settings = self.strategy_settings
        own = {key: value for key, value in changes.items() if key in _STRATEGY_KEYS}
        if settings is not None and own:
            settings = dataclasses.replace(settings, **own)
        return dataclasses.replace(self, **_run_keys(changes), **shared, strategy_settings=settings)

    def plugin_names(self) -> dict[str, str]:
        """Each kind of plugin the run uses and its name here (a built-in's, or `module:attribute`): a strategy
        section's key named after a kind names that one (FedAvg's `aggregate`); a mode naming no aggregate folds
        by fedavg's sum."""
        named = {
            "dataset": self.data.dataset,
            "model": self.model,
            "local_step": self.training.local_step,
            "aggregate": "fedavg",
        }
        settings = self.strategy_settings
        if settings is not None:
            named.update({key: getattr(settings, key) for key in _fields_of(settings) if key in named})
        return named

    def to_dict(self) -> dict[str, Any]:
        """The flat dict a file writes and the store holds: every key of every mode, another mode's at its
        default, as before the keys had sections."""
        flat: dict[str, Any] = {}
        for key, value in asdict(self).items():
            if key in _SHARED_SECTIONS:
                flat.update(value)  # a section's keys where the section stands
            elif key in _RUN_KEYS:
                flat[key] = value
        flat.update({key: default_of(owner, key) for key, owner in _STRATEGY_KEYS.items()})
        if self.strategy_settings is not None:
            flat.update(asdict(self.strategy_settings))
        return flat

    @classmethod
    def from_dict(cls, raw: dict[str, Any], check_data: bool = True) -> RunConfig:
        """Validate `raw` and build the config; raises ConfigError naming the field.

        `check_data=False` accepts a data_root that does not exist (yet): `fedqueue check` shows the config anyway.
        """
        if not isinstance(raw, dict):
            raise ConfigError("config: expected a table of settings")
        for key in raw:
            check_known_key(key)
        flare_weight = raw.get("staleness_weight")
        if isinstance(flare_weight, bool):  # FLARE's staleness_weight is a flag
            rule = "flare_sqrt" if flare_weight else "none"
            raise ConfigError(f'staleness_weight: FLARE\'s {str(flare_weight).lower()} is "{rule}" here')
        values = {key: check_type(key, value, _KEY_TYPES[key]) for key, value in raw.items()}
        values = _with_max_rounds(raw, values)
        choice("mode", values.get("mode", "fedavg"), MODES)
        mode = STRATEGY_MODES[values.get("mode", "fedavg")]
        shared = {name: section(**_keys_of(name, values)) for name, section in _SHARED_SECTIONS.items()}
        config = cls(**_run_keys(values), **shared, strategy_settings=_strategy_section(mode, values))
        config._check_rules(check_data)
        return config

    @classmethod
    def from_stored(cls, stored: dict[str, Any]) -> RunConfig:
        """A run's config as the store holds it. One stored before the keys had sections holds every mode's keys,
        another mode's possibly set (nothing read them): those are left out."""
        mode = STRATEGY_MODES.get(str(stored.get("mode", "fedavg")))
        kept = {
            key: value
            for key, value in stored.items()
            if key not in _STRATEGY_KEYS or (mode is not None and _uses(mode, _STRATEGY_KEYS[key]))
        }
        return cls.from_dict(kept)

    @property
    def last_version(self) -> int | None:
        """The most versions a run makes: `rounds` synchronous rounds, or fedbuff's `max_model_version` (`rounds`
        when unset; None when unset beside max_sim_time: that time bounds it). A stop rule may end it sooner."""
        if self.strategy_mode.bound == "rounds":
            return self.rounds
        if self.max_model_version is not None:
            return self.max_model_version
        return None if self.max_sim_time is not None else self.rounds

    def stop_rules(self) -> StopRules:
        """The run's stops: its bound on versions and FedRevive's rules (fl/clock/stops.py)."""
        bound = "max_rounds" if self.max_rounds is not None else self.strategy_mode.bound
        return StopRules(
            last_version=self.last_version,
            bound=bound,
            max_sim_time=self.max_sim_time,
            target_accuracy=self.target_accuracy,
            early_stop=tuple((int(item["version"]), float(item["accuracy"])) for item in self.early_stop),
        )

    def _check_rules(self, check_data: bool = True) -> None:
        self._check_numbers()
        self._check_names()
        check_stop_rules(self.max_sim_time, self.target_accuracy, self.early_stop, self.eval_every, self.max_rounds)
        # The strategy's refusals come first: FedRevive's names kd_split's range before the data's split would.
        if self.strategy_settings is not None:
            self.strategy_settings.check(self)
        for name in _SHARED_SECTIONS:
            getattr(self, name).check(self)
        self._check_data(check_data)
        if self.tensorboard_dir is not None and (not self.tensorboard_dir.strip() or "\0" in self.tensorboard_dir):
            raise ConfigError(f"tensorboard_dir: a folder name, got {self.tensorboard_dir!r}")

    def _check_numbers(self) -> None:
        for key in ("num_devices", "devices_per_round", "rounds", "eval_every", "min_devices_per_round"):
            positive(key, getattr(self, key))
        if not self.global_lr > 0:
            raise ConfigError(f"global_lr: must be greater than 0, got {self.global_lr}")
        if self.devices_per_round > self.num_devices:
            raise ConfigError(
                f"devices_per_round: {self.devices_per_round} selected is more than num_devices = {self.num_devices}"
            )
        if self.min_devices_per_round > self.devices_per_round:
            raise ConfigError(
                f"min_devices_per_round: {self.min_devices_per_round} is more than "
                f"devices_per_round = {self.devices_per_round}"
            )
        if self.max_model_version is not None:
            positive("max_model_version", self.max_model_version)

    def _check_names(self) -> None:
        if not is_valid_name("model", self.model):
            raise ConfigError(f"model: unknown model {self.model!r} (choose from {describe_choices('model')})")
        if len(self.name) > NAME_MAX:
            raise ConfigError(f"name: at most {NAME_MAX} characters, got {len(self.name)}")
        choice("on_failure", self.on_failure, FAILURE_POLICIES)

    def _check_data(self, check_data: bool) -> None:
        try:
            json.dumps(self.plugin, allow_nan=False)
        except (TypeError, ValueError):
            raise ConfigError("plugin: values must be finite numbers, strings, booleans, lists or tables") from None
        if self.seed < 0:
            raise ConfigError(f"seed: must be 0 or more, got {self.seed}")
        if check_data and self.data.missing_root is not None:
            raise DataError(f"data_root: dataset root {self.data.data_root!r} does not exist")

    @property
    def strategy_mode(self) -> Mode:
        """What callers may know of the strategy that runs this config (fl/strategy/mode.py)."""
        return STRATEGY_MODES[self.mode]

    @property
    def held_out(self) -> float:
        """The share of the training set no device gets (FedRevive's kd_split), else 0."""
        settings = self.strategy_settings
        return self.kd_split if isinstance(settings, FedReviveSection) and not settings.data_free else 0.0

    @property
    def data_free(self) -> bool:
        """FedRevive distilling on synthesised images (kd_augmentation = "dfkd")."""
        settings = self.strategy_settings
        return isinstance(settings, FedReviveSection) and settings.data_free


def check_known_key(key: str, where: str = "") -> None:
    """A run-config key, else one line: FLARE's name for it, the closest knob, or where every knob is listed."""
    if key in _KEY_TYPES:
        return
    if key in FLARE_NAMES:
        raise ConfigError(f"{where}{key}: {FLARE_NAMES[key]}")
    hint = did_you_mean(key, _KEY_TYPES) or " (every knob: docs/reference/run-config.md)"
    raise ConfigError(f"{where}{key}: unknown setting{hint}")


S = TypeVar("S")

# The run's own keys; the sections every run has, by the field that holds each, and which section holds each of
# their keys; each strategy's section, and which key it declares (a section may extend another's, as FedRevive's
# extends FedBuff's, whose keys stay FedBuff's).
_RUN_KEYS = key_types(RunConfig)
_SHARED_SECTIONS: dict[str, type] = {
    "data": DataSection,
    "training": TrainingSection,
    "packing": PackSection,
    "timing": ClockSection,
}
_SHARED_KEYS: dict[str, str] = {key: name for name, section in _SHARED_SECTIONS.items() for key in key_types(section)}
_STRATEGY_SECTIONS: tuple[type, ...] = tuple(
    dict.fromkeys(mode.section for mode in STRATEGY_MODES.values() if mode.section is not None)
)
_STRATEGY_KEYS: dict[str, type] = {key: section for section in _STRATEGY_SECTIONS for key in own_keys(section)}
_KEY_TYPES: dict[str, KeyType] = {
    **_RUN_KEYS,
    **{key: key_types(_SHARED_SECTIONS[name])[key] for key, name in _SHARED_KEYS.items()},
    **{key: key_types(owner)[key] for key, owner in _STRATEGY_KEYS.items()},
}


def config_sections() -> list[tuple[str, type, list[str]]]:
    """The reference page's order: a heading, the dataclass and the keys it declares, for the run's own keys, the
    sections every run has, then each strategy's section (a section that extends another lists only the keys it
    adds)."""
    sections: list[tuple[str, type, list[str]]] = [("Every run", RunConfig, list(_RUN_KEYS))]
    sections += [(_heading(section), section, list(key_types(section))) for section in _SHARED_SECTIONS.values()]
    sections += [(_heading(section), section, own_keys(section)) for section in _STRATEGY_SECTIONS]
    return sections


def _heading(section: type) -> str:
    return (section.__doc__ or section.__name__).strip().splitlines()[0].rstrip(".")


def _keys_of(name: str, values: dict[str, Any]) -> dict[str, Any]:
    """The keys of `values` that the shared section held by field `name` declares."""
    return {key: value for key, value in values.items() if _SHARED_KEYS.get(key) == name}


def _fields_of(section: Section | None) -> list[str]:
    return [] if section is None else [spec.name for spec in dataclasses.fields(section)]


def _run_keys(values: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in values.items() if key in _RUN_KEYS}


def _strategy_section(mode: Mode, values: dict[str, Any]) -> Section | None:
    """The mode's section from its keys; another mode's key is refused unless it holds its default (a config
    stored before sections holds every mode's key)."""
    own: dict[str, Any] = {}
    for key, owner in _STRATEGY_KEYS.items():
        if key not in values:
            continue
        if mode.section is not None and issubclass(mode.section, owner):
            own[key] = values[key]
        elif values[key] != default_of(owner, key):
            users = " or ".join(repr(other.name) for other in STRATEGY_MODES.values() if _uses(other, owner))
            raise ConfigError(f"{key}: applies to mode = {users}; this run's mode is {mode.name!r} (remove the key)")
    return None if mode.section is None else mode.section(**own)


def _uses(mode: Mode, section: type) -> bool:
    return mode.section is not None and issubclass(mode.section, section)


def _with_max_rounds(raw: dict[str, Any], values: dict[str, Any]) -> dict[str, Any]:
    """max_rounds fills the mode's own bound (rounds, or max_model_version); given both, they must agree."""
    limit = values.get("max_rounds")
    if limit is None:
        return values
    if limit <= 0:
        raise ConfigError(f"max_rounds: must be a positive integer, got {limit}")
    # An unknown mode is named by the mode check, after this.
    mode = STRATEGY_MODES.get(str(values.get("mode", "fedavg")))
    own = "rounds" if mode is None else mode.bound
    if raw.get(own) is not None and raw[own] != limit:
        raise ConfigError(f"max_rounds: {limit} sets {own}, which is {raw[own]}; set one of them")
    return {**values, own: limit}


def parse_override(text: str) -> tuple[str, Any]:
    """Parse one `key=value` override; the value is read as TOML (`rounds=5`, `model="cnn"`).

    A bare word that is not valid TOML is taken as a string, so `model=cnn` works too; `none` unsets a knob that
    may be unset (a number, a table of numbers: `target_accuracy=none`), and stays the word where a string may be.
    """
    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep or not key:
        raise ConfigError(f"--set expects KEY=VALUE, got {text!r} (no spaces around '=': --set {key or 'KEY'}=VALUE)")
    check_known_key(key, where="--set ")
    try:
        value = tomllib.loads(f"v = {raw.strip()}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw.strip()
    spec = _KEY_TYPES[key]
    if value == "none" and spec.optional and str not in spec.accepted:
        value = None
    return key, value


def load_run_config(path: str | Path | None, overrides: dict[str, Any] | None = None) -> RunConfig:
    """Read a config file (TOML, or FedRevive's JSON; none: all defaults), apply overrides, validate."""
    return read_run_config(path, overrides).config


def load_run_config_with_notes(
    path: str | Path | None, overrides: dict[str, Any] | None = None
) -> tuple[RunConfig, list[str]]:
    """`load_run_config`, plus one note per key the file gave that means nothing here."""
    loaded = read_run_config(path, overrides)
    return loaded.config, loaded.notes


@dataclass(frozen=True)
class LoadedConfig:
    """A validated config and where its keys came from: what `fedqueue check` shows beside it."""

    config: RunConfig
    notes: list[str]
    from_file: frozenset[str]  # keys the file set (FedRevive's JSON: the knobs its keys became)
    from_command: frozenset[str]  # keys the command line set (--set and its options)
    fedrevive_json: bool = False


def read_run_config(
    path: str | Path | None, overrides: dict[str, Any] | None = None, check_data: bool = True
) -> LoadedConfig:
    """The config a file and overrides make, with the file's notes and which keys each gave.

    A file that sets nothing (empty, or only comments) is refused unless overrides set something: running
    every default is never what a config file was written for. `check_data=False`: see `RunConfig.from_dict`.
    """
    read = ConfigFile({})
    if path is not None:
        read = read_config_file(Path(path))
        if not read.raw and not overrides:
            raise ConfigError(
                f"config: {str(path)!r} sets nothing, so every setting would be its default;"
                " write the settings to run (e.g. rounds = 10; see examples/)"
            )
    for key in overrides or {}:
        read.origins.pop(key, None)  # set on the command line: named as given there
    raw = {**read.raw, **(overrides or {})}
    try:
        config = RunConfig.from_dict(raw, check_data=check_data)
    except ConfigError as err:
        raise read.named_as_written(err) from None
    return LoadedConfig(config, read.notes, frozenset(read.raw), frozenset(overrides or {}), read.fedrevive)


def config_toml(config: RunConfig) -> str:
    """The config as TOML that `load_run_config` reads back to an equal config (unset knobs left out)."""
    import tomli_w  # only `fedqueue check` writes TOML

    plain = {key: value for key, value in config.to_dict().items() if value is not None and value != {}}
    tables = {key: plain.pop(key) for key in list(plain) if isinstance(plain[key], dict)}
    return tomli_w.dumps({**plain, **tables})
