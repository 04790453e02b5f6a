"""Plugins by import path and the Python API, through real Redis and real worker processes."""

from __future__ import annotations

import sys
import textwrap
from dataclasses import replace
from pathlib import Path

import pytest
import torch

import fedqueue
from fedqueue.config import Settings
from fedqueue.errors import ConfigError, DataError
from fedqueue.fl.config import RunConfig
from fedqueue.fl.ml.plugins import resolve
from fedqueue.fl.setup import check_plugins
from fedqueue.fl.store.results import device_tasks
from tests.conftest import running_workers
from tests.support.cli_runner import fedqueue_cli
from tests.support.helpers import assert_same_weights, reference_final_state, small_config

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "plugins"


@pytest.fixture
def plugin_settings(settings: Settings) -> Settings:
    return settings.with_plugin_path([str(EXAMPLES)])


def final_weights_of_runs_together(
    settings: Settings, configs: list[RunConfig], tmp_path: Path
) -> list[dict[str, torch.Tensor]]:
    """Submit the runs at once on two real workers; each must finish."""
    with running_workers(settings, procs=2, log_dir=tmp_path / "logs"):
        handles = [fedqueue.submit(config, settings=settings) for config in configs]
        statuses = [handle.wait(timeout_s=120) for handle in handles]
    assert [status["state"] for status in statuses] == ["finished"] * len(configs)
    return [handle.final_weights() for handle in handles]


def test_fedprox_with_mu_zero_equals_builtin_fedavg(plugin_settings: Settings, tmp_path: Path) -> None:
    builtin = small_config(partition="dirichlet", alpha=0.5)
    fedprox = builtin.with_keys(local_step="fedqueue_examples.fedprox:fedprox_step", plugin={"mu": 0.0})
    proximal = replace(fedprox, plugin={"mu": 1.0})
    weights = final_weights_of_runs_together(plugin_settings, [builtin, fedprox, proximal], tmp_path)
    assert_same_weights(weights[0], weights[1])
    # The plugin really runs: a strong proximal term changes the result.
    assert any(not (weights[0][name] == weights[2][name]).all() for name in weights[0])


def test_clipped_aggregation_rule_runs_on_the_workers(plugin_settings: Settings, tmp_path: Path) -> None:
    """A server-side rule through real workers: unclipped it is FedAvg bit for bit; clipped, it bounds the step."""
    from fedqueue.fl.ml.data import load_federated
    from fedqueue.fl.ml.models import initial_state
    from fedqueue.fl.setup import data_spec

    builtin = small_config(rounds=1, global_lr=0.5)
    loose = builtin.with_keys(aggregate="fedqueue_examples.clipping:clipped_fedavg", plugin={"clip_norm": 1e9})
    tight = replace(loose, plugin={"clip_norm": 0.01})
    plugin_settings.activate_plugin_path()
    resolve.cache_clear()
    with pytest.raises(ConfigError, match="clip_norm must be a number > 0"):
        check_plugins(replace(loose, plugin={"clip_norm": -1}))
    weights = final_weights_of_runs_together(plugin_settings, [builtin, loose, tight], tmp_path)
    assert_same_weights(weights[0], weights[1])
    data = load_federated(data_spec(builtin))
    start = initial_state(builtin.model, data.input_shape, data.num_classes, builtin.seed)

    def step(state: dict[str, torch.Tensor]) -> float:
        return sum(float((state[name].double() - start[name].double()).pow(2).sum()) for name in start) ** 0.5

    # The mean of changes clipped to 0.01 moves the model at most global_lr x 0.01; FedAvg moved it further.
    assert 0 < step(weights[2]) <= 0.5 * 0.01 * (1 + 1e-6) < step(weights[0])


def test_custom_dataset_with_natural_splits_runs_end_to_end(plugin_settings: Settings, tmp_path: Path) -> None:
    config = RunConfig.from_dict(
        {
            "dataset": "fedqueue_examples.writers:load",
            "model": "fedqueue_examples.nets:groupnorm_cnn",
            "num_devices": 40,
            "devices_per_round": 6,
            "rounds": 2,
            "local_iters": 3,
            "seed": 1,
            "plugin": {"width": 8},
        }
    )
    with running_workers(plugin_settings, procs=2, log_dir=tmp_path / "logs"):
        handle = fedqueue.submit(config, settings=plugin_settings)
        status = handle.wait(timeout_s=120)
    assert status["state"] == "finished" and status["tasks_done"] == 12
    # Each device trained on its writer's own samples: the sizes the plugin's split gives.
    sys.path.insert(0, str(EXAMPLES))
    from fedqueue.fl.ml.data import load_federated
    from fedqueue.fl.setup import data_spec

    partitions = load_federated(data_spec(config)).partitions
    for task in device_tasks(handle.store, handle.id):
        assert task.samples == len(partitions[task.device])
    assert handle.final_weights()["1.weight"].shape == (8,)  # the plugin model's GroupNorm, width from [plugin]


def test_natural_splits_must_match_num_devices(plugin_settings: Settings) -> None:
    plugin_settings.activate_plugin_path()
    with pytest.raises(DataError, match="num_devices: .* 40 natural partitions"):
        fedqueue.submit(
            {"dataset": "fedqueue_examples.writers:load", "num_devices": 30, "devices_per_round": 5},
            settings=plugin_settings,
        )
    assert fedqueue.runs(plugin_settings) == []  # refused before anything was written


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"model": "no_such_package.nets:build"}, "model: cannot import 'no_such_package.nets'"),
        ({"local_step": "fedqueue_examples.fedprox:missing"}, "local_step: 'fedqueue_examples.fedprox' has no"),
        ({"aggregate": "fedqueue_examples.fedprox:__doc__"}, "aggregate: .* is not callable"),
        ({"local_step": "fedqueue_examples.fedprox:fedprox_step", "plugin": {"mu": -1}}, "plugin: mu must be"),
    ],
)
def test_plugins_are_checked_before_submit(plugin_settings: Settings, overrides: dict, message: str) -> None:
    plugin_settings.activate_plugin_path()
    resolve.cache_clear()
    with pytest.raises(ConfigError, match=message):
        check_plugins(small_config(**overrides))


def test_unimportable_plugin_is_one_line_and_writes_nothing(tmp_path: Path) -> None:
    config = tmp_path / "run.toml"
    config.write_text('model = "nowhere.nets:build"\nnum_devices = 10\ndevices_per_round = 2\n')
    database = tmp_path / "store.db"
    env = {"PATH": "/usr/bin:/bin", "FEDQUEUE_DATABASE_URL": f"sqlite:///{database}"}
    result = fedqueue_cli("run", str(config), cwd=tmp_path, env=env, timeout=60)
    assert result.returncode == 2
    assert (
        result.stderr.strip()
        == "error: model: cannot import 'nowhere.nets' (ModuleNotFoundError: No module named 'nowhere')"
    )
    assert not database.exists()


def test_plugin_that_raises_on_the_worker_surfaces_in_status(settings: Settings, tmp_path: Path) -> None:
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    (plugins / "broken_step.py").write_text(
        textwrap.dedent("""
        def step(model, batch, global_state, options):
            raise RuntimeError("boom from the plugin")
    """)
    )
    settings = replace(settings.with_plugin_path([str(plugins)]), max_attempts=2)
    config = small_config(rounds=2, devices_per_round=3, local_step="broken_step:step")
    with running_workers(settings, procs=1, log_dir=tmp_path / "logs"):
        status = fedqueue.submit(config, settings=settings).wait(timeout_s=120)
    assert status["state"] == "failed"
    assert "every selected device failed" in status["error"]
    assert len(status["failures"]) == 3
    for failure in status["failures"]:
        assert failure["attempts"] == 2
        assert "Traceback" in failure["error"] and "RuntimeError: boom from the plugin" in failure["error"]
        assert "broken_step.py" in failure["error"]  # the worker's own traceback, not a summary


def test_two_runs_at_once_on_the_same_workers_equal_each_alone(settings: Settings) -> None:
    first = small_config(local_lr=0.05, seed=11)
    second = small_config(local_lr=0.2, seed=12, model="cnn")
    with fedqueue.local_cluster(procs=2, settings=replace(settings, broker_url=None)) as cluster:
        handles = [fedqueue.submit(config, settings=cluster.settings) for config in (first, second)]
        reports = [handle.wait(timeout_s=180) and handle.report() for handle in handles]
        # Interleaved: the second run started before the first one finished.
        first_done = handles[0].store.get_run(handles[0].id).finished_at
        second_start = min(t.started_at for t in handles[1].store.task_timings(handles[1].id))
        assert second_start < first_done
    for handle, config, report in zip(handles, (first, second), reports, strict=True):
        assert report["state"] == "finished" and len(report["rounds"]) == 2
        assert_same_weights(handle.final_weights(), reference_final_state(config))


def test_api_accepts_dict_path_and_runconfig(tmp_path: Path) -> None:
    path = tmp_path / "run.toml"
    path.write_text("rounds = 3\n")
    from fedqueue.fl.api import load_config

    assert load_config(path, {"seed": 4}) == RunConfig(rounds=3, seed=4)
    assert load_config({"rounds": 3}, {"seed": 4}) == RunConfig(rounds=3, seed=4)
    assert load_config(RunConfig(rounds=3), {"seed": 4}) == RunConfig(rounds=3, seed=4)
    with pytest.raises(ConfigError, match="rounds"):
        load_config({"rounds": 0})
    with pytest.raises(ConfigError, match="FEDQUEUE_BROKER_URL"):
        fedqueue.submit({"rounds": 1}, settings=Settings(database_url=f"sqlite:///{tmp_path / 'x.db'}"))
