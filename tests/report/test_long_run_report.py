"""The report and status of a long run stay legible and bounded: 10,000 versions, rows written as workers would."""

from __future__ import annotations

import csv
import io
import re
from pathlib import Path
from typing import Any

import pytest
from matplotlib.collections import PolyCollection

from fedqueue.config import Settings
from fedqueue.core.database import open_store
from fedqueue.fl.cli import staleness_text
from fedqueue.fl.store.results import list_rounds
from fedqueue.report import write_report
from fedqueue.report.long_table import PAGE_ROWS, shown_rows
from fedqueue.report.plots import PLOT_PIXELS
from fedqueue.store import Store
from tests.support.bench_scripts import load_bench_module
from tests.support.cli_inputs import cli_env
from tests.support.cli_runner import fedqueue_cli

VERSIONS = 10_000


def long_store(path: Path, versions: int, in_flight: int = 20) -> Store:
    """A finished FedBuff run "long" of `versions` versions of one update each, on 2 workers of 2 slots."""
    store = open_store(f"sqlite:///{path}", migrate=True)
    load_bench_module("report_scale").buffered_run(
        store, "long", versions=versions, devices=100_000, buffer_size=1, in_flight=in_flight, workers=2, slots=2
    )
    return store


def test_the_report_of_10000_versions_is_a_short_page_with_every_version_beside_it(tmp_path: Path) -> None:
    store = long_store(tmp_path / "store.db", VERSIONS)
    try:
        numbers = write_report(store, "long", tmp_path / "out")
    finally:
        store.close()
    assert len(numbers["rounds"]) == VERSIONS
    page = (tmp_path / "out" / "report.html").read_text()
    # Every row inline made 2.7 MB; the first and last rows and every 500th keep it small.
    assert len(page.encode()) < 100_000
    table = page.split("<h2>Versions</h2>")[1].split("</table>")[0]
    shown = [int(cell) for cell in re.findall(r"<tr><td>(\d+)</td>", table)]
    assert shown[:10] == list(range(1, 11)) and shown[-10:] == list(range(VERSIONS - 9, VERSIONS + 1))
    assert list(range(500, VERSIONS - 10, 500)) == [v for v in shown if 10 < v <= VERSIONS - 10]
    assert "… 489 versions …" in table  # between version 10 and version 500
    # Every version: in the CSV, and on pages of PAGE_ROWS linked from the report and from each other.
    pages = re.findall(r'<a href="(versions-\d+\.html)">', page)
    assert pages == [f"versions-{n}.html" for n in range(1, VERSIONS // PAGE_ROWS + 1)]
    assert '<a href="versions.csv">' in page
    with (tmp_path / "out" / "versions.csv").open() as file:
        rows = list(csv.DictReader(file))
    assert [int(row["version"]) for row in rows] == list(range(1, VERSIONS + 1))
    assert float(rows[-1]["accuracy"]) == numbers["rounds"][-1]["accuracy"]  # unrounded
    last = (tmp_path / "out" / pages[-1]).read_text()
    assert [int(v) for v in re.findall(r"<tr><td>(\d+)</td>", last)] == list(range(9001, VERSIONS + 1))
    assert all(f'href="{name}"' in last for name in pages[:-1]) and 'href="report.html"' in last


def test_a_crowded_timeline_is_drawn_a_bar_per_pixel_and_says_so(tmp_path: Path) -> None:
    from fedqueue.fl.view.report import BUFFERED_WORDS
    from fedqueue.report.plots import timeline_figure
    from fedqueue.report.run_data import load_run_data
    from fedqueue.report.timeline import RoundMark

    store = long_store(tmp_path / "store.db", 3000)
    try:
        data = load_run_data(store, "long")
        marks = [RoundMark(row.round_index, row.enqueued_at, row.aggregated_at) for row in list_rounds(store, "long")]
    finally:
        store.close()
    figure = timeline_figure(
        data.lanes, data.spans, marks, data.samples, data.run.created_at, data.end, "long", BUFFERED_WORDS
    )
    plot = figure.axes[0]
    bars = sum(len(c.get_paths()) for c in plot.collections if isinstance(c, PolyCollection))
    tasks = len(data.spans)
    assert tasks == 6000 and bars < tasks and bars < 3 * PLOT_PIXELS * len(data.lanes) // 2
    said = re.search(r"([\d,]+) tasks drawn as ([\d,]+) bars: a slot's tasks within a pixel", plot.get_xlabel())
    assert said is not None and said.groups() == (f"{tasks:,}", f"{bars:,}")
    # Version marks at round numbers: v0, v500, v1000, ...
    assert [text.get_text() for text in plot.texts] == [f"v{n}" for n in range(0, 3000, 500)]


def test_a_short_timeline_draws_every_task_and_says_nothing_of_it(tmp_path: Path) -> None:
    from fedqueue.report.plots import timeline_figure
    from fedqueue.report.run_data import load_run_data

    store = long_store(tmp_path / "store.db", 40, in_flight=4)
    try:
        data = load_run_data(store, "long")
    finally:
        store.close()
    figure = timeline_figure(data.lanes, data.spans, [], [], data.run.created_at, data.end)
    assert figure.axes[0].get_xlabel() == "seconds since the run was submitted"


def test_the_table_of_few_rows_is_shown_whole() -> None:
    assert shown_rows(60) == (list(range(60)), 1)
    positions, step = shown_rows(61)
    assert step == 2 and positions[:11] == [*range(10), 11] and positions[-1] == 60 and len(positions) < 61
    positions, step = shown_rows(2000)
    assert step == 50 and positions[:11] == [*range(10), 49] and positions[-11:] == [1949, *range(1990, 2000)]


def test_status_of_a_long_run_stays_a_screen_and_sums_up_its_staleness(tmp_path: Path) -> None:
    long_store(tmp_path / "store.db", 3000, in_flight=200).close()
    env = {**cli_env(Settings(database_url=f"sqlite:///{tmp_path / 'store.db'}")), "COLUMNS": "120"}
    shown = fedqueue_cli("status", "long", cwd=tmp_path, env=env, timeout=120)
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert len(lines) < 30 and max(len(line) for line in lines) <= 120, shown.stdout
    # 200 staleness values, listed one by one before: now their mean, median and range.
    assert re.search(r"staleness mean [\d.]+, median \d+, 0–199 over 3000 updates", " ".join(shown.stdout.split()))


def test_staleness_is_listed_while_it_has_few_values() -> None:
    assert staleness_text({"0": 4, "1": 2}) == "0: 4, 1: 2"
    assert staleness_text({}) == "none"
    many = {str(s): 1 for s in range(13)}
    assert staleness_text(many) == "mean 6.0, median 6, 0–12 over 13 updates (each: --json)"


def test_a_followers_poll_reads_only_the_steps_not_yet_written_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each poll of a long run read every row it had (0.6 s a poll at 10,000 versions); the steps done, stored
    and written whole are read once."""
    import fedqueue.fl.view.tensorboard as tensorboard

    store = long_store(tmp_path / "store.db", 3000)
    read: list[int] = []

    def counted(store: Store, run_id: str, after: int = 0) -> list[Any]:
        rows = list_rounds(store, run_id, after)
        read.append(len(rows))
        return rows

    monkeypatch.setattr(tensorboard, "list_rounds", counted)
    try:
        scalars = tensorboard.RunScalars(store, "long", tmp_path / "tb")
        run = store.get_run("long")
        first = scalars.points(run, ended=False)
        assert {point.step for point in first} == set(range(1, 3001))
        assert scalars.points(run, ended=False) == [] and read == [3000, 1]  # the last done step stays open
        # The run's end still writes the last step again (a stop rule's evaluation), and nothing else.
        assert {point.step for point in scalars.points(run, ended=True)} == {3000}
    finally:
        scalars.close()
        store.close()


def test_a_follower_shows_the_last_versions_of_a_long_run_not_every_one(tmp_path: Path) -> None:
    from rich.console import Console
    from rich.progress import Progress

    from fedqueue.cli.follow import show_bars
    from fedqueue.core.jobs import ProgressBar
    from fedqueue.fl.view.bars import SHOWN, RoundProgress

    store = long_store(tmp_path / "store.db", 3000)
    try:
        bars = RoundProgress(store, "long").bars()
    finally:
        store.close()
    assert [bar.label for bar in bars] == [f"version {n}" for n in range(3001 - SHOWN, 3001)]
    # As versions are made, the display takes on the new ones and lets the older ones go.
    display = Progress(console=Console(file=io.StringIO()))
    shown: dict[str, Any] = {}
    for last in (SHOWN, SHOWN + 1, SHOWN + 5):
        show_bars(
            display, shown, [ProgressBar(str(n), f"v{n}", 1, 1, "updates") for n in range(last - SHOWN + 1, last + 1)]
        )
    assert [task.fields["label"] for task in display.tasks] == [f"v{n}" for n in range(6, SHOWN + 6)]
