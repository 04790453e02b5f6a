"""Packs of devices per task, through real Redis and real worker processes.

Sequential packs give the weights of one device per task bit for bit; vmapped packs are
deterministic and match them within float tolerance; a pack that fails is retried, then
split, so a poisoned device fails alone; a worker killed mid-pack loses nothing.
"""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from pathlib import Path

import pytest
import torch

from fedqueue.config import Settings
from fedqueue.errors import ConfigError
from fedqueue.fl import api
from fedqueue.fl.messages import is_pack_sum_key
from fedqueue.fl.packs.tasks import cut_packs
from fedqueue.fl.store.results import device_tasks
from fedqueue.fl.strategy.sync.rounds import select_devices
from fedqueue.report import write_report
from fedqueue.report.summary import run_summary
from tests.conftest import running_workers
from tests.support.cli_inputs import cli_env
from tests.support.cli_runner import fedqueue_cli
from tests.support.helpers import assert_same_weights, reference_final_state, small_config
from tests.support.reliability_support import (
    SLOW_STEP,
    launcher,
    one_result_per_device,
    pid_of_worker,
    reliable_settings,
    slow_config,
    wait_until,
)

EXAMPLES = Path(__file__).resolve().parents[3] / "examples" / "plugins"
PACKED = small_config(num_devices=40, devices_per_round=20, rounds=2, local_iters=5, partition="dirichlet")


def _finish_together(
    settings: Settings, configs: Sequence[api.ConfigLike], procs: int, tmp_path: Path
) -> list[api.RunHandle]:
    with running_workers(settings, procs=procs, log_dir=tmp_path / f"logs-{procs}"):
        handles = [api.submit(config, settings=settings) for config in configs]
        statuses = [handle.wait(timeout_s=180) for handle in handles]
    assert [status["state"] for status in statuses] == ["finished"] * len(configs), statuses
    return handles


def test_sequential_packs_of_1_5_and_20_give_the_same_weights(settings: Settings, tmp_path: Path) -> None:
    configs = [PACKED.with_keys(pack_size=size) for size in (1, 5, 20)]
    handles = _finish_together(settings, configs, 2, tmp_path)
    reference = reference_final_state(PACKED)
    for handle in handles:
        assert_same_weights(handle.final_weights(), reference)
        one_result_per_device(handle)
    # Every device keeps its own row; its timing names the pack it was trained in.
    selected = select_devices(PACKED.seed, 1, PACKED.num_devices, PACKED.devices_per_round)
    timings = handles[1].store.task_timings(handles[1].id, 1)
    trained = {row.task: row.pack for row in timings if row.task_type == "train"}
    expected = {f"round 1 device {d}": f"pack {p[0]}-{p[-1]}" for p in cut_packs(selected, 5) for d in p}
    assert trained == expected
    assert {row.pack for row in handles[0].store.task_timings(handles[0].id, 1)} == {None}


@pytest.mark.slow
def test_vmapped_packs_are_deterministic_and_match_sequential(settings: Settings, tmp_path: Path) -> None:
    """The same seed gives the same weights with 1 and with 2 workers, within float tolerance of sequential."""
    vmapped = PACKED.with_keys(pack_size=6, pack_mode="vmap")
    # A rule that needs every update apart (the clipping example, unclipped: FedAvg's result).
    every_update = vmapped.with_keys(aggregate="fedqueue_examples.clipping:clipped_fedavg", plugin={"clip_norm": 1e9})
    one = _finish_together(settings, [vmapped], 1, tmp_path)[0]
    two, apart = _finish_together(settings.with_plugin_path([str(EXAMPLES)]), [vmapped, every_update], 2, tmp_path)
    assert_same_weights(one.final_weights(), two.final_weights())
    reference = reference_final_state(PACKED)
    for handle in (one, apart):
        for name, value in handle.final_weights().items():
            torch.testing.assert_close(value, reference[name], atol=1e-5, rtol=0, msg=name)
    one_result_per_device(one)
    # FedAvg gets one pre-summed update per pack, shared by the pack's rows; the other rule one per device.
    summed = {row.update_key for row in device_tasks(one.store, one.id, 1)}
    assert len(summed) == 4 and all(key and is_pack_sum_key(key) for key in summed)
    apart_keys = [row.update_key for row in device_tasks(apart.store, apart.id, 1)]
    assert len(set(apart_keys)) == PACKED.devices_per_round
    assert not any(key and is_pack_sum_key(key) for key in apart_keys)
    # A vmapped pack's devices share its timing, and its name.
    rows = [row for row in one.store.task_timings(one.id, 1) if row.task_type == "train"]
    by_pack: dict[str | None, set[tuple[float, float]]] = {}
    for row in rows:
        by_pack.setdefault(row.pack, set()).add((row.started_at, row.finished_at))
    assert len(rows) == PACKED.devices_per_round and len(by_pack) == 4 and None not in by_pack
    assert all(len(spans) == 1 for spans in by_pack.values())
    # The report and status count a vmapped pack as one task on one slot, standing for its devices.
    report = write_report(one.store, one.id, tmp_path / "report")
    assert report["packing"] == {"pack_size": 6, "pack_mode": "vmap"}
    assert report["tasks_by_type"]["train"]["done"] == 8 and report["devices_trained"] == 40
    assert report["slots"] == 1 and (tmp_path / "report" / "timeline.png").stat().st_size > 0
    summary = run_summary(one.store, one.id)
    assert summary["max_concurrency"] == 1 and summary["packing"]["pack_mode"] == "vmap"


def test_a_poisoned_device_fails_alone_and_its_pack_mates_are_stored(settings: Settings, tmp_path: Path) -> None:
    """The pack is tried twice as a pack, then its devices one by one: only the poisoned one fails."""
    settings = reliable_settings(settings, max_attempts=2)
    seed, num_devices, per_round = 7, 30, 8
    selected = select_devices(seed, 1, num_devices, per_round)
    poisoned = selected[1]  # second of the first pack: one pack-mate is stored before it, two after
    config = small_config(
        local_step=SLOW_STEP,
        dataset="fq_reliability:poisoned_digits",
        rounds=1,
        devices_per_round=per_round,
        num_devices=num_devices,
        seed=seed,
        pack_size=4,
        plugin={"poison_device": poisoned, "poison_mode": "raise"},
    )
    handle = _finish_together(settings, [config], 2, tmp_path)[0]
    rows = {row.device: row for row in device_tasks(handle.store, handle.id, 1)}
    assert sorted(rows) == selected
    failed = rows[poisoned]
    assert failed.state == "failed" and failed.attempt == 2
    assert failed.error is not None and "RuntimeError: poisoned sample" in failed.error
    assert all(row.state == "done" for device, row in rows.items() if device != poisoned)
    # The pack-mate trained before the poisoned device was stored by the pack's first attempt.
    assert rows[selected[0]].attempt == 1


@pytest.mark.faults
def test_a_worker_killed_mid_pack_loses_nothing(settings: Settings, tmp_path: Path) -> None:
    """Devices stored before the kill are skipped when the pack comes back; the rest train on its second delivery."""
    settings = reliable_settings(settings)
    config = slow_config(0.2, rounds=1, devices_per_round=6, local_iters=4, pack_size=3)
    selected = select_devices(config.seed, 1, config.num_devices, config.devices_per_round)
    packs = cut_packs(selected, 3)
    with launcher(settings, procs=2, cwd=tmp_path) as workers:
        handle = api.submit(config, settings=settings)

        def half_stored() -> tuple[tuple[int, ...], list[int], str] | None:
            stored = {row.device: row.worker for row in device_tasks(handle.store, handle.id, 1)}
            for pack in packs:
                done = [device for device in pack if device in stored]
                if 0 < len(done) < len(pack):
                    return pack, done, stored[done[0]]
            return None

        wait_until(lambda: half_stored() is not None, 60)
        found = half_stored()
        assert found is not None
        pack, stored_before, hostname = found
        subprocess.run(["kill", "-KILL", str(pid_of_worker(workers, hostname))], check=True)
        wait_until(lambda: handle.store.get_run(handle.id).state != "running", 120)
    assert handle.store.get_run(handle.id).state == "finished"
    one_result_per_device(handle)
    rows = {row.device: row for row in device_tasks(handle.store, handle.id, 1)}
    assert all(row.state == "done" for row in rows.values())
    assert [rows[device].attempt for device in stored_before] == [1] * len(stored_before)
    # The pack's other devices were trained by its second delivery (a device stored in the instant
    # between reading the store and the kill keeps its first attempt).
    assert any(rows[device].attempt == 2 for device in pack if device not in stored_before)
    assert_same_weights(handle.final_weights(), reference_final_state(config))


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"model": "resnet18"}, "vmap cannot train this model: the model has BatchNorm running statistics"),
        ({"local_step": SLOW_STEP}, "local_step 'fq_reliability:slow_step' cannot run under vmap"),
    ],
)
def test_what_cannot_be_vmapped_is_refused_at_submit(
    settings: Settings, changes: dict[str, object], message: str
) -> None:
    settings = reliable_settings(settings)
    config = small_config().with_keys(pack_size=4, pack_mode="vmap", **changes)
    with pytest.raises(ConfigError, match=message) as refused:
        api.submit(config, settings=settings)
    assert str(refused.value).endswith('use pack_mode = "sequential"')
    assert api.runs(settings=settings) == []  # nothing was written


def test_the_cli_refuses_a_model_that_cannot_be_vmapped_in_one_line(settings: Settings, tmp_path: Path) -> None:
    config = tmp_path / "vmap.toml"
    config.write_text('model = "resnet18"\ndataset = "synthetic"\npack_size = 4\npack_mode = "vmap"\n')
    result = fedqueue_cli("submit", str(config), cwd=tmp_path, env=cli_env(settings), timeout=120)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "BatchNorm" in lines[0] and 'pack_mode = "sequential"' in lines[0]
    assert api.runs(settings=settings) == []


@pytest.mark.slow
def test_the_demo_config_packed_by_default_reaches_the_accuracy_of_one_device_per_task(
    settings: Settings, tmp_path: Path
) -> None:
    """The demo as shipped ("auto": chosen at submit) against one device per task, and the same default
    config submitted twice: the same choice both times, and the same weights bit for bit."""
    demo = api.load_config(Path(__file__).resolve().parents[3] / "examples" / "digits_fedavg.toml")
    assert (demo.packing.pack_size, demo.packing.pack_mode) == ("auto", "auto")
    plain = demo.with_keys(pack_size=1, pack_mode="sequential")
    single, auto, again = _finish_together(settings, [plain, demo, demo], 2, tmp_path)
    chosen = [api.load_config(handle.store.get_run(handle.id).config) for handle in (auto, again)]
    # 2 worker slots answered: packs of 5. Vmapped or not is timed (vmap on a quiet machine; a loaded one may
    # time the loop faster): the second submit takes the first's choice, so both runs pack the same way.
    packed = [(config.packing.pack_size, config.packing.pack_mode) for config in chosen]
    assert packed[0] == packed[1] and packed[0] in [(5, "vmap"), (5, "sequential")], chosen
    assert "timed" in chosen[0].packing.pack_choice
    assert_same_weights(auto.final_weights(), again.final_weights())
    accuracy = [handle.status()["final_accuracy"] for handle in (single, auto)]
    assert accuracy[0] > 0.9 and abs(accuracy[0] - accuracy[1]) <= 0.005, accuracy
