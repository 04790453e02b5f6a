"""What `fedqueue check` says beside a resolved config: which keys the user set, the rules that stop the run
before its bound, and a dataset folder that is not there yet.

Pure text from a loaded config; the command prints it (the TOML on stdout, the rest on stderr).
"""

from __future__ import annotations

import re

from fedqueue.fl.config import LoadedConfig, RunConfig, config_toml

FILE_MARK = "# set"  # a key the config file gave
COMMAND_MARK = "# --set"  # a key the command line gave (over the file's)
_KEY_LINE = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*) = ")
_TABLE_LINE = re.compile(r"^\[([A-Za-z_][A-Za-z0-9_]*)\]$")

# Where each dataset's files lie under data_root (torchvision's layout).
DATA_FOLDERS = {"cifar10": "cifar-10-batches-py", "cifar100": "cifar-100-python"}


def marks(loaded: LoadedConfig) -> dict[str, str]:
    """Each key the user set, and the mark that says who: the command line's override wins."""
    given = {key: FILE_MARK for key in loaded.from_file}
    given.update({key: COMMAND_MARK for key in loaded.from_command})
    if "max_rounds" in given and loaded.config.max_rounds is not None:
        # max_rounds is written out as the mode's own bound too: both were set by it.
        given.setdefault(loaded.config.strategy_mode.bound, given["max_rounds"])
    return given


def marked_toml(loaded: LoadedConfig) -> str:
    """The config as TOML (as `config_toml` writes it), each key the user set marked by a comment; the rest are
    defaults. TOML comments, so the text still reads back to the same config."""
    given = marks(loaded)
    lines = [f'# "{FILE_MARK}": set by the file; "{COMMAND_MARK}": set on the command line; unmarked: defaults']
    in_table = False
    for line in config_toml(loaded.config).splitlines():
        table = _TABLE_LINE.match(line)
        key = _KEY_LINE.match(line) if not in_table else None
        name = table.group(1) if table else key.group(1) if key else None
        in_table = in_table or table is not None
        lines.append(f"{line}  {given[name]}" if name in given else line)
    return "\n".join(lines) + "\n"


def stop_lines(config: RunConfig, fedrevive_json: bool = False) -> list[str]:
    """The keys that end the run before it has made its versions (FedRevive's stop rules), one line each, and how
    to run without them; nothing when no such key is set."""
    rules: list[str] = []
    if config.max_rounds is not None:
        rules.append(f"max_rounds = {config.max_rounds} (FedRevive's name): version {config.max_rounds} is the last")
    if config.max_sim_time is not None:
        rules.append(
            f"max_sim_time = {config.max_sim_time:g} (FedRevive's max_wait_time): no update arriving at simulated time"
            f" {config.max_sim_time:g} or later is taken"
        )
    if config.target_accuracy is not None:
        rules.append(
            f"target_accuracy = {config.target_accuracy:g}: the run stops at the first evaluation of at least"
            f" {config.target_accuracy:g}"
        )
    for item in config.early_stop:
        rules.append(
            f"early_stop: the run stops at version {item['version']} if its best accuracy so far is at most"
            f" {item['accuracy']:g}"
        )
    if not rules:
        return []
    lines = ["these keys stop the run early:", *(f"  {rule}" for rule in rules)]
    unset = {"target_accuracy": "none", "early_stop": "[]", "max_rounds": "none", "max_sim_time": "none"}
    present = [key for key in unset if getattr(config, key)]
    lines.append("  to run past them: " + " ".join(f"--set {key}={unset[key]}" for key in present))
    if fedrevive_json:
        lines.append(
            "their published table: --set max_sim_time=200 --set target_accuracy=none --set early_stop=[];"
            " their shifted schedule: max_sim_time=100, max_rounds=none (their FedRevive made 51,325 versions"
            " there) and its three delays (docs/fl/coming-from.md)"
        )
    return lines


def missing_data_line(config: RunConfig) -> str | None:
    """A warning naming the dataset folder that is not there (`fedqueue run` refuses the config until it is)."""
    root = config.data.missing_root
    if root is None:
        return None
    folder = DATA_FOLDERS.get(config.data.dataset, config.data.dataset)
    return (
        f"warning: data_root: dataset root {root!r} does not exist here; `fedqueue run` refuses this config until"
        f" it holds {folder}/ (or --set data_root=FOLDER names another)"
    )
