"""`fedqueue report`: numbers from stored rows, pictures and HTML, and the command on a real run."""

from __future__ import annotations

import json
import re
import subprocess
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from matplotlib.image import imread
from sqlalchemy import update

import fedqueue
from fedqueue.config import Settings
from fedqueue.core.database import open_store
from fedqueue.errors import NotFound
from fedqueue.fl.store.results import add_round, claim_round, complete_round
from fedqueue.fl.store.schema import RoundRow
from fedqueue.fl.view.report import report_page, rounds_report
from fedqueue.report import RunData, build_report, compute_report, write_report
from fedqueue.report.html import render_html
from fedqueue.report.timeline import Span
from fedqueue.store import Store
from fedqueue.store.repo import TaskTiming
from fedqueue.store.schema import RunRow
from fedqueue.store.utilization import Sample, record_samples, samples_between
from tests.conftest import running_workers
from tests.support.cli_runner import fedqueue_cli
from tests.support.helpers import small_config

T0 = 1_000_000.0
PICTURES = ("timeline.png", "concurrency.png", "accuracy.png")


def approx(expected: float) -> object:
    """Report numbers are rounded: to 3 decimals (4 for efficiencies)."""
    return pytest.approx(expected, abs=6e-4)


def run_row(state: str = "running", finished_at: float | None = None, name: str = "") -> RunRow:
    return RunRow(
        id="run1",
        name=name,
        config={"dataset": "digits", "model": "mlp"},
        state=state,
        rounds_total=2,
        created_at=T0,
        finished_at=finished_at,
        error=None,
    )


def round_row(index: int, enqueued: float, aggregated: float | None, selected: list[int]) -> RoundRow:
    return RoundRow(
        run_id="run1",
        round_index=index,
        version=index - 1,
        state="done" if aggregated else "training",
        selected=selected,
        model_key="k",
        model_sha256="0" * 64,
        model_nbytes=1,
        enqueued_at=enqueued,
        aggregated_at=aggregated,
        aggregate_ms=100.0 if aggregated else None,
        eval_ms=50.0 if aggregated else None,
        accuracy=0.5 if aggregated else None,
        loss=1.0 if aggregated else None,
        train_loss=None,
    )


def task(
    round_index: int,
    device: int,
    worker: str,
    start: float,
    finish: float,
    *,
    state: str = "done",
    attempt: int = 1,
    enqueued: float = T0,
) -> Span:
    return Span(
        task=f"round {round_index} device {device}",
        round_index=round_index,
        worker=worker,
        pid=7,
        device_used="cpu",
        state=state,
        attempt=attempt,
        enqueued_at=enqueued,
        started_at=T0 + start,
        finished_at=T0 + finish,
        load_ms=100.0,
        compute_ms=600.0,
        upload_ms=50.0,
    )


def example(now: float = T0 + 10.0, state: str = "running", finished_at: float | None = None) -> dict[str, Any]:
    """Round 1 done (5 selected: 4 done, one retried, one failed); round 2 still training; two single-slot workers.

    The report's numbers: the core's, and the FL kind's from the rounds, as `build_report` merges them."""
    rounds = [round_row(1, T0, T0 + 4.0, [0, 1, 2, 3, 4]), round_row(2, T0 + 4.5, None, [5, 6])]
    spans = [
        task(1, 0, "a@h", 0.5, 1.5),
        task(1, 1, "a@h", 1.75, 2.75, attempt=2),
        task(1, 2, "b@h", 0.5, 2.5),
        task(1, 3, "b@h", 2.5, 3.5),
        task(1, 4, "b@h", 3.5, 3.5, state="failed", attempt=3),
        task(2, 5, "a@h", 5.0, 8.0, enqueued=T0 + 4.5),
    ]
    samples = [
        Sample("a@h", 7, "cpu", T0 + second, utilization, 2**20 * (100 + second))
        for second, utilization in zip(range(1, 11), [10, 20, 30, 40, 50, 60, 70, 80, 90, 100], strict=True)
    ]
    data = RunData(run=run_row(state, finished_at), spans=spans, samples=samples, now=now)
    numbers = compute_report(data)
    return {**numbers, **rounds_report(data, rounds, {}, numbers)}


def test_round_numbers_of_a_run_still_going() -> None:
    report = example()
    assert report["slots"] == 2 and report["state"] == "running"
    assert report["wall_s"] == approx(10.0)  # measured up to now
    first, second = report["rounds"]
    assert (first["selected"], first["done"], first["failed"], first["retried"]) == (5, 4, 1, 2)
    assert first["wall_s"] == approx(4.0)
    assert first["parallel_efficiency"] == approx((1 + 1 + 2 + 1) / (4.0 * 2))
    assert first["tasks_per_s"] == approx(1.0)
    assert first["time"]["compute_s"] == approx(4 * 0.6)
    assert first["time"]["load_s"] == approx(0.4) and first["time"]["upload_s"] == approx(0.2)
    assert first["time"]["aggregation_s"] == approx(0.1) and first["time"]["evaluation_s"] == approx(0.05)
    assert first["time"]["queue_wait_mean_s"] == approx((0.5 + 1.75 + 0.5 + 2.5) / 4)
    # a@h idled 0.25 s between devices 0 and 1 with device 1 waiting; b@h started device 3 at once.
    assert first["time"]["between_tasks_s"] == approx(0.25)
    assert first["time"]["slots_idle_s"] == approx(8.0 - 5.0 - 0.25)
    assert "slots_starting_s" not in first["time"]  # split for the run as a whole only
    assert second["state"] == "training" and second["wall_s"] == approx(10.0 - 4.5)
    assert second["done"] == 1 and second["parallel_efficiency"] == approx(3.0 / (5.5 * 2))
    assert report["parallel_efficiency"] == approx(8.0 / (10.0 * 2))
    assert report["tasks_done"] == 5 and report["tasks_failed"] == 1 and report["tasks_retried"] == 2


def test_slowest_devices_and_utilization() -> None:
    report = example()
    assert [s["task"] for s in report["slowest"]] == [
        "round 2 device 5",
        "round 1 device 2",
        "round 1 device 0",
        "round 1 device 1",
        "round 1 device 3",
    ]
    assert report["slowest"][0]["seconds"] == approx(3.0)
    (only,) = report["utilization"]
    assert (only["worker"], only["pid"], only["kind"], only["samples"]) == ("a@h", 7, "cpu", 10)
    assert only["utilization_mean"] == approx(55.0)
    assert only["utilization_p95"] == approx(95.5)
    assert only["memory_peak_bytes"] == 2**20 * 110


def test_a_finished_run_is_measured_to_its_end_not_to_now() -> None:
    report = example(now=T0 + 1000, state="finished", finished_at=T0 + 9.0)
    assert report["wall_s"] == approx(9.0)


def test_html_escapes_user_strings_and_shows_pictures_and_the_round_table() -> None:
    report = {**example(), "name": "<script>alert('x')</script>", "error": "round 2: <b>boom</b>"}
    page = render_html(report, report_page(report))
    assert "<script>" not in page and "<b>boom" not in page
    assert "&lt;script&gt;" in page and "&lt;b&gt;boom" in page
    # The accuracy curves first, right under the headline; then the timeline.
    assert re.findall(r'<img src="([a-z]+\.png)"', page) == ["accuracy.png", "timeline.png", "concurrency.png"]
    headline_end = page.index("</table>", page.index('<table class="headline">'))
    assert headline_end < page.index('<img src="accuracy.png"') < page.index("<h2>Timeline</h2>")
    rounds_table = page.split("<h2>Rounds</h2>")[1].split("</table>")[0]
    assert rounds_table.count("<tr><td>") == 2
    assert "<td>training</td>" not in rounds_table and '<td class="text">training</td>' in rounds_table


def filled_store(path: Path, rounds: int) -> tuple[Store, str]:
    """A store written by hand: `rounds` rounds, two workers with two slots each, one failed device."""
    store = open_store(f"sqlite:///{path}", migrate=True)
    store.create_run("hand", "by hand", {"dataset": "digits", "model": "mlp"}, rounds, kind="fl")
    start = time.time() - rounds - 5  # the whole made-up timeline lies in the past
    with store.session() as session, session.begin():
        session.execute(update(RunRow).where(RunRow.id == "hand").values(created_at=start))
    clock = start + 0.1
    for index in range(1, rounds + 1):
        enqueued = clock
        add_round(
            store,
            RoundRow(
                run_id="hand",
                round_index=index,
                version=index - 1,
                state="training",
                selected=list(range(8)),
                model_key="k",
                model_sha256="0" * 64,
                model_nbytes=1,
                enqueued_at=enqueued,
            ),
        )
        for device in range(8):
            worker, slot = divmod(device % 4, 2)
            began = enqueued + 0.01 + (device // 4) * 0.2 + slot * 0.05
            failed = index == 2 and device == 7
            store.record_timing(
                TaskTiming(
                    run_id="hand",
                    kind="fl",
                    task_type="train",
                    task=f"round {index} device {device}",
                    round_index=index,
                    state="failed" if failed else "done",
                    worker=f"cpu{worker}@host",
                    pid=100 + worker,
                    device_used="cpu",
                    attempt=3 if failed else 1,
                    enqueued_at=enqueued,
                    started_at=began,
                    finished_at=began if failed else began + 0.18,
                    load_ms=10.0,
                    compute_ms=150.0,
                    upload_ms=10.0,
                    error="boom" if failed else None,
                )
            )
        clock = enqueued + 0.5
        assert claim_round(store, "hand", index, "agg", stale_before=0.0)
        complete_round(
            store,
            "hand",
            index,
            "agg",
            aggregate_ms=20.0,
            eval_ms=10.0,
            accuracy=0.1 + index / (rounds + 1),
            loss=2.0 - index / rounds,
            train_loss=2.1 - index / rounds,
        )
    record_samples(
        store,
        [
            Sample(f"cpu{w}@host", 100 + w, "cpu", start + t / 4, 50.0 + 10 * w, 2**28)
            for w in (0, 1)
            for t in range(1, 4 * rounds)
        ],
    )
    store.finish_run("hand", "finished")
    return store, "hand"


def assert_picture(path: Path, min_width: int = 800) -> None:
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert path.stat().st_size > 10_000
    pixels = imread(path)
    assert pixels.shape[1] >= min_width and pixels.shape[0] >= 300
    assert len(np.unique(pixels.reshape(-1, pixels.shape[-1]), axis=0)) > 20  # drawn, not blank


@pytest.mark.parametrize("rounds", [3, 25])  # a legend entry per round, or a colour bar for many
def test_write_report_draws_every_picture(tmp_path: Path, rounds: int) -> None:
    store, run_id = filled_store(tmp_path / "store.db", rounds)
    numbers = write_report(store, run_id, tmp_path / "out")
    for name in PICTURES:
        assert_picture(tmp_path / "out" / name)
    assert numbers["slots"] == 4 and numbers["tasks_failed"] == 1 and len(numbers["rounds"]) == rounds
    assert [(u["worker"], u["samples"] > 0) for u in numbers["utilization"]] == [
        ("cpu0@host", True),
        ("cpu1@host", True),
    ]
    assert "report.html" in {path.name for path in (tmp_path / "out").iterdir()}


def test_unknown_run_is_not_found(tmp_path: Path) -> None:
    store, _ = filled_store(tmp_path / "store.db", 1)
    with pytest.raises(NotFound, match="'nope' does not exist"):
        build_report(store, "nope")


def cli(*args: str, database: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {"PATH": "/usr/bin:/bin", "FEDQUEUE_DATABASE_URL": f"sqlite:///{database}"}
    return fedqueue_cli(*args, cwd=cwd, env=env, timeout=120)


@pytest.mark.slow
def test_report_of_a_real_run_through_workers(settings: Settings, tmp_path: Path) -> None:
    # Long enough (a few seconds) for every worker to take several one-second utilization samples.
    config = small_config(rounds=3, devices_per_round=8, local_iters=250, model="cnn")
    with running_workers(settings, procs=2, log_dir=tmp_path / "logs"):
        handle = fedqueue.submit(config, settings=settings)
        status = handle.wait(timeout_s=120)
    assert status["state"] == "finished"
    database = Path(settings.database_url.removeprefix("sqlite:///"))

    written = cli("report", handle.id, "-o", str(tmp_path / "report"), database=database, cwd=tmp_path)
    assert written.returncode == 0, written.stderr
    assert "report.html" in written.stdout
    for name in PICTURES:
        assert_picture(tmp_path / "report" / name)
    page = (tmp_path / "report" / "report.html").read_text()
    assert len(re.findall(r'<img src="(?:timeline|concurrency|accuracy)\.png"', page)) == 3
    rounds_table = page.split("<h2>Rounds</h2>")[1].split("</table>")[0]
    assert [int(row) for row in re.findall(r"<tr><td>(\d+)</td>", rounds_table)] == [1, 2, 3]

    printed = cli("report", handle.id, "--json", database=database, cwd=tmp_path)
    assert printed.returncode == 0, printed.stderr
    numbers = json.loads(printed.stdout)
    assert 0 < numbers["parallel_efficiency"] <= 1
    assert numbers["slots"] == 2 and numbers["tasks_done"] == 27 and numbers["tasks_per_s"] > 0
    # Device tasks and aggregations are read from the one timing table: 3 rounds of 8 devices, 3 aggregations.
    assert numbers["tasks_by_type"] == {"aggregate": {"done": 3, "failed": 0}, "train": {"done": 24, "failed": 0}}
    for row in numbers["rounds"]:
        assert (row["selected"], row["done"], row["failed"]) == (8, 8, 0)
        assert 0 < row["parallel_efficiency"] <= 1
        assert set(row["time"]) >= {
            "queue_wait_mean_s",
            "load_s",
            "compute_s",
            "upload_s",
            "aggregation_s",
            "evaluation_s",
        }
    seconds = [entry["seconds"] for entry in numbers["slowest"]]
    assert len(seconds) == 5 and seconds == sorted(seconds, reverse=True)
    workers = {(task.worker, task.pid) for task in handle.store.task_timings(handle.id)}
    assert {(u["worker"], u["pid"]) for u in numbers["utilization"]} == workers
    for entry in numbers["utilization"]:
        assert entry["kind"] == "cpu" and entry["samples"] >= 2
        assert entry["utilization_p95"] > 0 and entry["memory_peak_bytes"] > 100 * 2**20  # torch is loaded
    # Every worker wrote samples of its own process while it lived, not only during the run.
    assert {(s.worker, s.pid) for s in samples_between(handle.store, 0, float("inf"))} == workers


def test_report_of_an_unknown_run_is_one_line_and_exit_2(tmp_path: Path) -> None:
    open_store(f"sqlite:///{tmp_path / 'store.db'}", migrate=True).close()
    result = cli("report", "nope", database=tmp_path / "store.db", cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.strip() == "error: run 'nope' does not exist"
    assert not (tmp_path / "fedqueue-report").exists()


def versions_timeline(versions: int, tmp_path: Path) -> tuple[Any, Path]:
    """A buffered run's timeline drawn by hand: two workers, five tasks trained on each version, a fold pass each."""
    from fedqueue.fl.view.report import BUFFERED_WORDS
    from fedqueue.report.plots import timeline_figure
    from fedqueue.report.timeline import RoundMark, pack_lanes

    spans = []
    for index in range(1, versions + 1):
        at = index * 0.1
        for device in range(5):
            start = at + device * 0.02
            spans.append(task(index, device, f"cpu{device % 2}@h", start, start + 0.018))
        spans.append(replace(task(index, 99, "cpu0@h", at + 0.099, at + 0.1), task_type="aggregate"))
    marks = [RoundMark(index, T0 + index * 0.1, T0 + (index + 1) * 0.1) for index in range(1, versions + 1)]
    end = T0 + (versions + 1) * 0.1
    figure = timeline_figure(pack_lanes(spans), spans, marks, [], T0, end, "by hand", BUFFERED_WORDS)
    path = tmp_path / f"timeline-{versions}.png"
    figure.savefig(path)
    return figure, path


@pytest.mark.parametrize("versions", [4, 20, 2000])
def test_a_buffered_timeline_colours_by_version_with_a_colour_bar_and_a_short_legend(
    tmp_path: Path, versions: int
) -> None:
    figure, path = versions_timeline(versions, tmp_path)
    assert_picture(path)
    plot, bar = figure.axes
    # One legend under the plot, of what the bars and lines are: no entry per version, however many.
    (legend,) = figure.legends
    assert [text.get_text() for text in legend.get_texts()] == ["fold pass", "version published"]
    assert bar.get_ylabel() == "version trained on"
    low, high = bar.get_ylim()
    assert round(low + 0.5 if versions < 10 else low) == 0 and round(high - 0.5 if versions < 10 else high) == (
        versions - 1
    )
    # The plot keeps the figure's width: nothing squashes it.
    assert plot.get_position().width > 0.75
    marks = [text.get_text() for text in plot.texts]
    assert marks[0] == "v0" and all(re.fullmatch(r"v\d+", mark) for mark in marks) and len(marks) <= 13


def test_idle_slots_are_split_by_what_they_waited_on() -> None:
    """Before a slot's first task with tasks queued is its worker starting, not "nothing queued"; later, idle with
    a task waiting is told apart from idle with nothing queued."""
    time = example()["time"]
    # Tasks waited over [0, 3.5] and [4.5, 5] s (queue waits of every task, the failed one's too).
    # a@h and b@h each waited 0.5 s for their first task: starting.
    assert time["slots_starting_s"] == approx(1.0)
    # a@h idle with a task queued: 1.5-1.75 (the dispatch gap, counted apart), 2.75-3.5, 4.5-5; b@h: 4.5-5.
    assert time["idle_tasks_waiting_s"] == approx(0.75 + 0.5 + 0.5)
    assert time["between_tasks_s"] == approx(0.25)
    # 20 slot-seconds, 8 busy, 0.25 between tasks: the rest idle with nothing queued.
    assert time["slots_idle_s"] == approx(20 - 8 - 0.25)
    assert time["idle_nothing_queued_s"] == approx(11.75 - 1.0 - 1.75)


def test_a_run_whose_workers_start_after_submit_is_starting_not_idle_with_nothing_queued() -> None:
    """The case seen: every task queued at submit, the workers' first task 6 s later. That is start-up."""
    spans = [task(1, d, "a@h" if d % 2 else "b@h", 6.0 + d // 2, 7.0 + d // 2) for d in range(4)]
    numbers = compute_report(RunData(run_row("finished", T0 + 8.0), spans, [], T0 + 100))
    spent = numbers["time"]
    assert spent["slots_starting_s"] == approx(2 * 6.0) and spent["idle_tasks_waiting_s"] == approx(0.0)
    assert spent["idle_nothing_queued_s"] == approx(2 * 8.0 - 4.0 - 12.0)
    page = render_html({**numbers, "job": None})
    assert "slots starting: before their first task, tasks queued" in page
    starting_row = page.split("slots starting")[1].split("</tr>")[0]
    assert "12.000" in starting_row
