"""TensorBoard event files of FL runs, read back with TensorBoard's own event reader.

A run's scalars are written from the store by whoever follows it: `fedqueue run` as it goes, `fedqueue.run()`,
and `fedqueue report --tensorboard` afterwards. Each (tag, step) is written once, whoever wrote first.
"""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from statistics import mean
from typing import Any

import pytest
from sqlalchemy import update
from tensorboard.backend.event_processing import event_accumulator

from fedqueue.config import Settings
from fedqueue.core.database import open_store
from fedqueue.fl import api
from fedqueue.fl.store.results import add_round, device_tasks, list_rounds
from fedqueue.fl.store.schema import RoundRow
from fedqueue.fl.view.tensorboard import RunScalars, run_folder, write_run_scalars
from fedqueue.store import Store
from fedqueue.store.repo import TaskTiming
from tests.conftest import running_workers
from tests.fl.strategy.fedbuff.test_buffered_async import BUFFERED
from tests.support.cli_inputs import cli_env
from tests.support.cli_runner import fedqueue_cli
from tests.support.helpers import small_config

SYNC_TOML = (
    "num_devices = 20\ndevices_per_round = 6\nrounds = 3\nlocal_iters = 3\nlocal_batch_size = 8\nseed = 5\n"
    'pack_size = 2\npack_mode = "sequential"\n'
)


def scalars(folder: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar tag in the folder's event files: its (step, value) pairs, as TensorBoard reads them."""
    reader = event_accumulator.EventAccumulator(str(folder), size_guidance={event_accumulator.SCALARS: 0})
    reader.Reload()
    return {tag: [(e.step, e.value) for e in reader.Scalars(tag)] for tag in reader.Tags()["scalars"]}


def approx(values: dict[int, float]) -> Any:
    """Event files hold 32-bit floats."""
    return {step: pytest.approx(value, rel=1e-6) for step, value in values.items()}


def stored(values: dict[int, float | None]) -> dict[int, float]:
    """Per-round values that every round has stored (a missing one fails the test)."""
    missing = [step for step, value in values.items() if value is None]
    assert not missing, f"rounds with no stored value: {missing}"
    return {step: value for step, value in values.items() if value is not None}


def stored_accuracy(store: Store, run_id: str) -> dict[int, float]:
    return {row.round_index: row.accuracy for row in list_rounds(store, run_id) if row.accuracy is not None}


def by_step(pairs: list[tuple[int, float]]) -> dict[int, float]:
    steps = [step for step, _ in pairs]
    assert len(steps) == len(set(steps)), f"a step written twice: {steps}"
    return dict(pairs)


@pytest.fixture(scope="module")
def tb_settings(redis_url: str, key_prefix: str, tmp_path_factory: pytest.TempPathFactory) -> Settings:
    """One store and queue for this module's runs: its tests share the same two workers."""
    folder = tmp_path_factory.mktemp("tensorboard")
    return Settings(
        broker_url=redis_url,
        database_url=f"sqlite:///{folder / 'fedqueue.db'}",
        key_prefix=f"{key_prefix}-tb-{uuid.uuid4().hex[:6]}",
        task_time_limit_s=120,
    )


@pytest.fixture(scope="module")
def workers(tb_settings: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    with pytest.MonkeyPatch.context() as patch:  # the workers' caches in the test's folders, not the user's
        patch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("worker-cache")))
        with running_workers(tb_settings, procs=2, log_dir=tmp_path_factory.mktemp("worker-logs")):
            yield


def test_run_writes_each_round_as_stored_and_report_writes_the_same(
    tb_settings: Settings, workers: None, tmp_path: Path
) -> None:
    config = tmp_path / "run.toml"
    config.write_text(SYNC_TOML)
    live = tmp_path / "live"
    env = cli_env(tb_settings)
    result = fedqueue_cli("run", str(config), "--tensorboard", str(live), cwd=tmp_path, env=env, timeout=180)
    assert result.returncode == 0, result.stdout + result.stderr
    store = open_store(tb_settings.database_url)
    try:
        found = re.search(r"run (\w+) submitted", result.stdout)
        assert found, result.stdout
        run = store.get_run(found.group(1))
        assert run.config["tensorboard_dir"] == str(live.resolve())
        # Where it writes, and how to look, said once as the run starts.
        said = f"TensorBoard files in {live.resolve() / run.id} · to see them: tensorboard --logdir {live.resolve()}"
        assert said in result.stdout.splitlines(), result.stdout
        assert result.stdout.index(said) < result.stdout.index("final accuracy")
        rows = list_rounds(store, run.id)
        accuracy = stored_accuracy(store, run.id)
        assert sorted(accuracy) == [1, 2, 3]

        written = scalars(run_folder(live, run.id))
        assert by_step(written["test/accuracy"]) == approx(accuracy)
        assert by_step(written["test/loss"]) == approx(stored({row.round_index: row.loss for row in rows}))
        label_wise = rows[-1].label_wise or {}
        for label, value in enumerate(label_wise["accuracy"]):
            assert by_step(written[f"label_wise/accuracy_{label}"])[3] == pytest.approx(value, rel=1e-6)
        seconds = {row.round_index: (row.aggregated_at or 0) - row.enqueued_at for row in rows}
        assert by_step(written["fedqueue/wall_seconds"]) == approx(seconds)
        for tag in ("fedqueue/device_tasks_per_second", "fedqueue/worker_utilization", "fedqueue/tasks_redone"):
            assert sorted(by_step(written[tag])) == [1, 2, 3], tag
        assert all(0 < value <= 1 for _, value in written["fedqueue/worker_utilization"])
        assert "test/time" not in written  # no simulated speeds: no simulated time

        # Afterwards, from the store: the same accuracies in a folder of its own; nothing again in the run's.
        again = fedqueue_cli("report", run.id, "--tensorboard", str(tmp_path / "after"), cwd=tmp_path, env=env)
        assert again.returncode == 0, again.stderr
        after = tmp_path / "after"
        (line,) = again.stdout.splitlines()
        assert re.fullmatch(
            rf"\d+ scalars written · TensorBoard files in {re.escape(str(after / run.id))}"
            rf" · to see them: tensorboard --logdir {re.escape(str(after))}",
            line,
        ), line
        assert by_step(scalars(run_folder(tmp_path / "after", run.id))["test/accuracy"]) == approx(accuracy)
        assert write_run_scalars(store, run.id, live) == (run_folder(live, run.id), 0)
    finally:
        store.close()


def test_a_buffered_run_writes_each_version_with_its_staleness(
    tb_settings: Settings, workers: None, tmp_path: Path
) -> None:
    config = small_config(**{**BUFFERED, "max_model_version": 4, "tensorboard_dir": str(tmp_path / "tb")})
    handle = api.run(config, settings=tb_settings)
    assert handle.state == "finished"
    rows = list_rounds(handle.store, handle.id)
    written = scalars(run_folder(tmp_path / "tb", handle.id))

    assert by_step(written["test/accuracy"]) == approx(stored_accuracy(handle.store, handle.id))
    assert sorted(by_step(written["test/accuracy"])) == [1, 2, 3, 4]
    assert by_step(written["test/time"]) == approx(stored({row.round_index: row.sim_time for row in rows}))
    folded: dict[int, list[int]] = {}
    for result in device_tasks(handle.store, handle.id):
        if result.fate == "folded" and result.folded_into is not None and result.staleness is not None:
            folded.setdefault(result.folded_into, []).append(result.staleness)
    assert by_step(written["aggregation/avg_staleness"]) == approx({v: mean(s) for v, s in folded.items()})
    assert any(value > 0 for _, value in written["aggregation/avg_staleness"])  # slow devices arrive late
    for tag in ("fedqueue/wall_seconds", "fedqueue/device_tasks_per_second", "fedqueue/worker_utilization"):
        assert sorted(by_step(written[tag])) == [1, 2, 3, 4], tag


def test_an_unwritable_tensorboard_dir_is_one_line_exit_2_before_anything_starts(tmp_path: Path) -> None:
    config = tmp_path / "run.toml"
    config.write_text(SYNC_TOML)
    (tmp_path / "a-file").write_text("")
    database = f"sqlite:///{tmp_path / 'store.db'}"
    store = open_store(database, migrate=True)
    store.create_run("r1", "", {"mode": "fedavg"}, 3, kind="fl")
    store.close()
    env = cli_env()
    for args, field in (
        (["run", str(config), "--tensorboard", str(tmp_path / "a-file" / "tb")], "tensorboard_dir"),
        (["report", "r1", "--tensorboard", str(tmp_path / "a-file")], "--tensorboard"),
    ):
        result = fedqueue_cli(*args, cwd=tmp_path, env={**env, "FEDQUEUE_DATABASE_URL": database})
        assert result.returncode == 2, result.stdout + result.stderr
        assert result.stderr.startswith(f"error: {field}:") and "Traceback" not in result.stderr
        assert len(result.stderr.strip().splitlines()) == 1
        assert "embedded Redis" not in result.stdout  # refused before any service started


def _done(store: Store, run_id: str, index: int, made: float, **metrics: Any) -> None:
    """Round `index` recorded and closed by hand, with one device trained on it."""
    row = RoundRow(
        run_id=run_id,
        round_index=index,
        version=index - 1,
        state="training",
        selected=[index],
        model_key="m",
        model_sha256="0" * 64,
        model_nbytes=1,
        enqueued_at=made - 1.0,
    )
    assert add_round(store, row)
    timing = TaskTiming(
        run_id,
        "fl",
        "train",
        f"round {index} device {index}",
        index,
        "done",
        "w",
        "cpu",
        1,
        made - 1.0,
        made - 0.9,
        made - 0.1,
    )
    store.record_timing(timing)
    with store.session() as session, session.begin():
        session.execute(
            update(RoundRow)
            .where(RoundRow.run_id == run_id, RoundRow.round_index == index)
            .values(state="done", aggregated_at=made, stored=1, **metrics)
        )


def test_steps_are_written_as_they_are_made_and_never_twice(tmp_path: Path) -> None:
    store = open_store(f"sqlite:///{tmp_path / 'store.db'}", migrate=True)
    try:
        root = tmp_path / "tb"
        store.create_run("r1", "", {"mode": "fedavg", "tensorboard_dir": str(root)}, 3, kind="fl")
        now = time.time()
        follower = RunScalars(store, "r1", root, every_s=3600)
        _done(store, "r1", 1, now + 1, accuracy=0.5, loss=2.0)
        assert follower.poll() > 0
        assert by_step(scalars(run_folder(root, "r1"))["test/accuracy"]) == approx({1: 0.5})

        _done(store, "r1", 2, now + 2, accuracy=0.6)
        assert follower.poll() == 0  # at most one look per every_s while the run goes on
        # A second writer (a follower after the first one died, a report) writes what the files lack, once.
        other = RunScalars(store, "r1", root, every_s=0)
        assert other.poll() > 0
        assert other.poll() == 0
        _done(store, "r1", 3, now + 3)  # the last version, made before its stop rule was known
        assert other.poll() > 0
        with store.session() as session, session.begin():  # its evaluation, recorded with the stop
            session.execute(update(RoundRow).where(RoundRow.round_index == 3).values(accuracy=0.8))
        store.finish_run("r1", "finished")
        assert other.poll() > 0 and other.closed
        follower.poll()
        assert follower.closed  # the look after the run ended is never put off

        written = scalars(run_folder(root, "r1"))
        assert by_step(written["test/accuracy"]) == approx({1: 0.5, 2: 0.6, 3: 0.8})
        for tag in ("fedqueue/wall_seconds", "fedqueue/device_tasks_per_second", "fedqueue/worker_utilization"):
            assert sorted(by_step(written[tag])) == [1, 2, 3], tag
        assert by_step(written["fedqueue/worker_utilization"])[2] == pytest.approx(0.8)  # 0.8 s busy of 1 s, 1 slot
        assert len(list(run_folder(root, "r1").glob("events.out.tfevents.*"))) == 2  # one file per writer
    finally:
        store.close()
