"""FedRevive's files with values of the wrong type: refused in one line naming the key, never cast, never a traceback."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from fedqueue.errors import ConfigError, DataError
from fedqueue.fl.config import load_run_config
from tests.fl.test_fedrevive_json import EXPECTED
from tests.support.cli_runner import fedqueue_cli

FILES = {name: make() for name, (make, _) in EXPECTED.items()}
# Every key of their files, and every key of their settings blocks, as a path.
PATHS = sorted(
    {(key,) for data in FILES.values() for key in data}
    | {
        (key, inner)
        for data in FILES.values()
        for key, value in data.items()
        if isinstance(value, dict)
        for inner in value
    }
)
WRONG = st.sampled_from(["many", None, [1, 2], 1.5, True, False, {}, {"a": 1}, -1, 0, "", 2.0, 1e308, "auto"])


def _mutated(name: str, path: tuple[str, ...], value: Any) -> dict[str, Any]:
    data = copy.deepcopy(FILES[name])
    target = data
    for key in path[:-1]:
        if not isinstance(target.get(key), dict):
            target[key] = {}
        target = target[key]
    target[path[-1]] = value
    return data


def _names_the_key(message: str, path: tuple[str, ...]) -> bool:
    """The line starts with the key the mutation changed, as their file writes it (or a key it depends on, the
    changed one then named with its value)."""
    named = message.split(":")[0].split(" ")[0]
    if f"{'.'.join(path)} = " in message:
        return True
    return named in (".".join(path), path[0]) or named.startswith(f"{path[0]}.") or named == "config"


@hypothesis_settings(max_examples=960, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=st.sampled_from(sorted(FILES)), path=st.sampled_from(PATHS), value=WRONG)
# Turned on in a file whose beta AFL-DW cannot follow: the refusal names the beta and the switch.
@example(name="fedbuff", path=("async_downweighting",), value=True)
def test_mutated_files_are_read_or_refused_in_one_line_naming_the_key(
    tmp_path: Path, name: str, path: tuple[str, ...], value: Any
) -> None:
    file = tmp_path / f"{name}.json"
    file.write_text(json.dumps(_mutated(name, path, value)))
    try:
        config = load_run_config(file, {"data_root": str(tmp_path)})
    except (ConfigError, DataError) as err:
        message = str(err)
        assert message.strip() and "\n" not in message.strip(), message
        assert _names_the_key(message, path), (path, value, message)
        return
    # Accepted: a float or a bool was never cast to a whole number on the way.
    if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
        for field in ("seed", "num_devices", "local_iters", "local_batch_size", "eval_every", "client_data_size"):
            assert not isinstance(config.to_dict()[field], bool), field
        assert config.max_rounds != 1 or value is not True


@pytest.mark.parametrize(
    ("key", "value", "line"),
    [
        ("num_clients", "many", "num_clients: expected an integer, got 'many'"),
        ("num_clients", None, "num_clients: expected an integer, got null"),
        ("num_clients", [1, 2], "num_clients: expected an integer, got a list"),
        ("max_rounds", 1.5, "max_rounds: expected an integer, got 1.5"),
        ("local_batch_size", True, "local_batch_size: expected an integer, got true"),
        ("local_iters", 25.0, "local_iters: expected an integer, got 25.0"),
        ("dirichlet_alpha", "half", "dirichlet_alpha: expected a number, got 'half'"),
        ("async_fl_settings", [1], "async_fl_settings: expected an object, got a list"),
    ],
)
def test_a_wrong_type_is_one_line_naming_the_key_with_exit_2(key: str, value: Any, line: str, tmp_path: Path) -> None:
    file = tmp_path / "fedbuff.json"
    file.write_text(json.dumps({**FILES["fedbuff"], key: value}))
    with pytest.raises(ConfigError) as caught:
        load_run_config(file, {"data_root": str(tmp_path)})
    assert str(caught.value) == line


def test_a_value_runconfig_refuses_is_named_as_their_file_writes_it(tmp_path: Path) -> None:
    data = copy.deepcopy(FILES["fedrevive"])
    data["dfkd_settings"]["nz"] = 1.5
    data["num_clients"] = 0
    file = tmp_path / "fedrevive.json"
    file.write_text(json.dumps(data))
    with pytest.raises(ConfigError, match=r"^num_clients \(fedqueue's num_devices\): "):
        load_run_config(file, {"data_root": str(tmp_path)})
    data["num_clients"] = 1000
    file.write_text(json.dumps(data))
    with pytest.raises(ConfigError, match=r"^dfkd_settings.nz \(fedqueue's dfkd.nz\): "):
        load_run_config(file, {"data_root": str(tmp_path)})


@pytest.mark.parametrize("suffix", [".json", ".toml"])
def test_absurd_nesting_is_one_line_with_exit_2(suffix: str, tmp_path: Path) -> None:
    file = tmp_path / f"deep{suffix}"
    depth = 100_000
    file.write_text("[" * depth + "]" * depth if suffix == ".json" else "x = " + "[" * depth + "]" * depth)
    result = fedqueue_cli("check", str(file), cwd=tmp_path, timeout=60)
    assert result.returncode == 2, result.stderr
    assert "nested too deep" in result.stderr and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_afl_dw_s_max_refused_is_named_as_their_file_writes_it(tmp_path: Path) -> None:
    """AFL-DW's s_max comes from dfkd_settings.adaptive_beta_factor: its refusal names that key, not fedqueue's."""
    data = copy.deepcopy(FILES["afl_dw"])
    data["dfkd_settings"]["adaptive_beta_factor"] = -1
    file = tmp_path / "afl_dw.json"
    file.write_text(json.dumps(data))
    with pytest.raises(ConfigError, match=r"^dfkd_settings\.adaptive_beta_factor \(fedqueue's staleness_s_max\): "):
        load_run_config(file, {"data_root": str(tmp_path)})
