"""A run's status, report and `fedqueue runs` line: the core's from runs and task timings, and each job kind's
keys through its hooks. On a real store, SQLite and Postgres (`database_url`).
"""

from __future__ import annotations

import dataclasses
import json
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from fedqueue.cli.follow import progress_of
from fedqueue.cli.launch import show_run
from fedqueue.cli.tensorboard import write_tensorboard
from fedqueue.config import Settings
from fedqueue.core import jobs
from fedqueue.core.broker.memory import memory_services
from fedqueue.core.services import Services
from fedqueue.errors import ConfigError
from fedqueue.fl.kind import KIND as FL_KIND
from fedqueue.fl.store.results import add_round, claim_round, complete_round, record_device_result
from fedqueue.report import build_report, write_report
from fedqueue.report.html import KindPage
from fedqueue.report.kind import KindViews
from fedqueue.report.run_data import RunData
from fedqueue.report.summary import run_lines, run_summary
from fedqueue.report.timeline import RoundMark, Span
from fedqueue.store import Store
from fedqueue.store.repo import TaskTiming
from fedqueue.store.schema import RunRow
from fedqueue.store.utilization import Sample, record_samples
from tests.store.test_store import device_result, new_run, round_row

# What the core says of any run, hooks or none.
CORE_STATUS = {
    "id",
    "name",
    "state",
    "error",
    "tasks_done",
    "tasks_failed",
    "wall_s",
    "task_busy_s",
    "workers",
    "devices_used",
    "max_concurrency",
}


@pytest.fixture
def register(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """Register kinds for one test: the installed ones stay, the test's own go afterwards."""
    monkeypatch.setattr(jobs, "_kinds", jobs.kinds())
    yield jobs.register


class Toy(jobs.JobKind):
    """A kind with no task and none of the hooks: the core's defaults alone."""

    name = "toy"
    handlers = ()

    def repair(self, services: Services, run_id: str) -> list[str]:
        return []


def timing(run_id: str, task: str, worker: str, start: float, finish: float, state: str = "done") -> TaskTiming:
    return TaskTiming(
        run_id=run_id,
        kind="toy",
        task_type="crunch",
        task=task,
        round_index=None,
        state=state,
        worker=worker,
        pid=7,
        device_used="cpu",
        attempt=2 if state == "failed" else 1,
        enqueued_at=start - 0.5,
        started_at=start,
        finished_at=finish,
        compute_ms=1000 * (finish - start),
    )


def toy_run(store: Store) -> str:
    """A finished run of the toy kind: tasks a and b overlap on two workers, c runs alone, d failed."""
    run_id = uuid.uuid4().hex
    store.create_run(run_id, "toy run", {"size": 3}, 0, kind="toy")
    start = time.time() - 60
    with store.session() as session, session.begin():
        session.get(RunRow, run_id).created_at = start  # type: ignore[union-attr]
    for name, worker, began, ended in (("a", "w1", 1, 3), ("b", "w2", 2, 4), ("c", "w1", 5, 6)):
        store.record_timing(timing(run_id, name, worker, start + began, start + ended))
    store.record_timing(timing(run_id, "d", "w2", start + 6, start + 6, state="failed"))
    record_samples(store, [Sample("w1", 7, "cpu", start + t, 40.0, 2**20) for t in range(1, 7)])
    assert store.finish_run(run_id, "finished")
    with store.session() as session, session.begin():
        session.get(RunRow, run_id).finished_at = start + 7  # type: ignore[union-attr]
    return run_id


def test_a_kind_without_hooks_gets_the_core_status_report_and_line(store: Store, register: Any, tmp_path: Path) -> None:
    register(Toy())
    run_id = toy_run(store)

    status = run_summary(store, run_id)
    assert set(status) == CORE_STATUS
    assert (status["state"], status["wall_s"], status["tasks_done"], status["tasks_failed"]) == ("finished", 7.0, 3, 1)
    assert status["workers"] == ["w1:7", "w2:7"] and status["max_concurrency"] == 2

    report = build_report(store, run_id)
    assert report["job"] is None and not {"rounds", "rounds_done", "simulated", "dataset"} & report.keys()
    assert report["tasks_by_type"] == {"crunch": {"done": 3, "failed": 1}} and report["slots"] == 2
    assert report["wall_s"] == 7.0 and report["task_busy_s"] == 5.0 and report["time"]["compute_s"] == 5.0
    assert [entry["task"] for entry in report["slowest"]] == ["a", "b", "c"]
    assert [entry["worker"] for entry in report["utilization"]] == ["w1"]

    assert write_report(store, run_id, tmp_path / "out") == report
    assert sorted(path.name for path in (tmp_path / "out").iterdir()) == [
        "concurrency.png",
        "report.html",
        "timeline.png",
    ]
    assert "<h2>Rounds</h2>" not in (tmp_path / "out" / "report.html").read_text()

    (line,) = [line for line in run_lines(store, store.list_runs()) if line["id"] == run_id]
    assert (line["state"], line["rounds"], line["dataset"], line["model"]) == ("finished", "", None, None)


def test_a_kind_without_hooks_gets_the_cores_bars_and_status_and_no_tensorboard_folder(
    store: Store, register: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The core calls every hook of a kind; a kind that writes none gets the core's defaults."""
    register(Toy())
    run_id = toy_run(store)
    services = memory_services(Settings(database_url="sqlite://"), store)

    (bar,) = progress_of(services, run_id).bars()
    assert (bar.label, bar.completed, bar.total, bar.note) == ("tasks", 4, None, "1 failed")
    assert Toy().retry_failed(services, run_id) == [] and Toy().new_cache() is None

    show_run(store, run_id, as_json=True)
    assert json.loads(capsys.readouterr().out) == run_summary(store, run_id)

    with pytest.raises(ConfigError, match="^--tensorboard: toy runs have no TensorBoard scalars$"):
        write_tensorboard(store, run_id, tmp_path / "events")
    assert not (tmp_path / "events").exists()


def test_a_kinds_hooks_add_their_keys_to_status_report_page_and_line(
    store: Store, register: Any, tmp_path: Path
) -> None:
    seen: dict[str, Any] = {}

    class ToyWithViews(Toy, KindViews):
        def summary(self, hook_store: Store, run: RunRow, spans: Sequence[Span]) -> dict[str, Any]:
            seen["summary"] = (hook_store is store, run.id, len(spans))
            return {"size": run.config["size"], "tasks_done": 30}  # a key of its own, and one over the core's

        def report_numbers(self, hook_store: Store, data: RunData, numbers: dict[str, Any]) -> dict[str, Any]:
            return {"job": {"crunched": numbers["tasks_done"]}, "spans_seen": len(data.spans)}

        def report_page(self, numbers: dict[str, Any]) -> KindPage:
            def draw(folder: Path, name: str) -> None:
                (folder / "toy.txt").write_text(name)

            return KindPage(
                headline=[("crunched", numbers["job"]["crunched"])],
                sections="<h2>Toy</h2>",
                rounds=[RoundMark(1, numbers["created_at"] + 1, numbers["created_at"] + 4)],
                draw=draw,
            )

        def run_columns(self, hook_store: Store, runs: Sequence[RunRow]) -> dict[str, dict[str, Any]]:
            return {run.id: {"rounds": f"size {run.config['size']}", "model": "toy-model"} for run in runs}

    register(ToyWithViews())
    run_id = toy_run(store)

    status = run_summary(store, run_id)
    assert set(status) == CORE_STATUS | {"size"} and status["size"] == 3
    assert status["tasks_done"] == 30 and status["tasks_failed"] == 1  # the kind's count replaces the core's
    assert seen["summary"] == (True, run_id, 4)

    report = write_report(store, run_id, tmp_path / "out")
    assert report["job"] == {"crunched": 3} and report["spans_seen"] == 4
    assert (tmp_path / "out" / "toy.txt").read_text() == f"run {run_id} (toy run)"
    page = (tmp_path / "out" / "report.html").read_text()
    assert "<h2>Toy</h2>" in page and "<b>3</b>" in page

    (line,) = [line for line in run_lines(store, store.list_runs()) if line["id"] == run_id]
    assert (line["rounds"], line["dataset"], line["model"]) == ("size 3", None, "toy-model")


def fl_run(store: Store, rounds: int) -> str:
    """An FL run written by hand: 3 devices a round (round 2's device 3 failed), each round aggregated."""
    run_id = new_run(store, rounds_total=rounds, model="mlp")
    aggregation = dataclasses.replace(timing(run_id, "", "w1", 1.0, 2.0), kind="fl", task_type="aggregate")
    for index in range(1, rounds + 1):
        assert add_round(store, round_row(run_id, index))
        for device in (1, 2, 3):
            state = "failed" if (index, device) == (2, 3) else "done"
            assert record_device_result(store, *device_result(run_id, index, device, state=state))
        store.record_timing(dataclasses.replace(aggregation, task=f"round {index} aggregation", round_index=index))
        assert claim_round(store, run_id, index, "agg", stale_before=0.0)
        assert complete_round(store, run_id, index, "agg", aggregate_ms=20.0, accuracy=0.5 + index / 10)
    return run_id


def test_an_fl_run_gets_its_rounds_through_the_fl_kinds_hooks(store: Store, register: Any) -> None:
    """Rounds, accuracy and device counts in an FL run's status and report come from the FL kind, not the core."""
    run_id = fl_run(store, rounds=2)
    status = run_summary(store, run_id)
    # 6 device results, one of them failed: the FL kind counts them (the core counts timings, aggregations too).
    assert (status["rounds_done"], status["tasks_done"], status["tasks_failed"]) == (2, 5, 1)
    assert status["accuracy"] == {"1": 0.6, "2": 0.7} and status["final_accuracy"] == 0.7
    report = build_report(store, run_id)
    assert [row["round"] for row in report["rounds"]] == [1, 2] and report["time"]["aggregation_s"] == 0.04
    (line,) = [line for line in run_lines(store, store.list_runs()) if line["id"] == run_id]
    assert (line["rounds"], line["dataset"], line["model"]) == ("2/2", "digits", "mlp")

    class FlWithoutViews(jobs.JobKind):  # the FL kind's tasks and repair, none of its views
        name = FL_KIND.name
        handlers = FL_KIND.handlers

        def repair(self, services: Services, run_id: str) -> list[str]:
            return FL_KIND.repair(services, run_id)

    register(FlWithoutViews())
    bare = run_summary(store, run_id)
    assert set(bare) == CORE_STATUS and (bare["tasks_done"], bare["tasks_failed"]) == (7, 1)
    assert "rounds" not in build_report(store, run_id)
    (line,) = [line for line in run_lines(store, store.list_runs()) if line["id"] == run_id]
    assert line["rounds"] == ""


def test_a_load_waits_for_the_warm_up_of_its_process_and_only_while_it_runs() -> None:
    """Imports beside a running warm-up can meet half-made modules: a task waits it out (a worker marks
    it before taking tasks); with no warm-up running it does not wait at all."""
    assert jobs.wait_for_warm_up(0)
    jobs.warm_up_started()
    try:
        assert not jobs.wait_for_warm_up(0.05)
    finally:
        jobs.warm_up_ended()
    assert jobs.wait_for_warm_up(0)
