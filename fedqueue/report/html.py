"""report.html: the pictures (referenced relatively, beside the page) and the tables. Every value is escaped.

The run's job kind adds its part of the page (`KindViews.report_page`): headline rows, sections, its pictures.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from html import escape
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fedqueue.report.cells import STYLE, html_head, html_row
from fedqueue.report.timeline import RoundMark, RoundWords

if TYPE_CHECKING:
    from fedqueue.report.long_table import LongTable


@dataclass(frozen=True)
class KindPage:
    """A job kind's part of report.html, made from the report's numbers."""

    headline: Sequence[tuple[str, Any]] = ()  # rows of the headline table, after the run's state
    breakdown: Sequence[tuple[str, float | None]] = ()  # phases run in one process while every slot waits
    top: str = ""  # HTML right under the headline, before the timeline: what a reader looks for first
    sections: str = ""  # HTML after the time breakdown and the job's own numbers
    rounds: Sequence[RoundMark] = ()  # marked on the timeline and concurrency pictures
    words: RoundWords = RoundWords()  # how those pictures name the rounds (FL's buffered runs: versions)
    draw: Callable[[Path, str], None] | None = None  # draws the kind's pictures: (folder, the run's title)
    tables: Sequence[LongTable] = ()  # written beside the page, whole (`sections` shows their summaries)


def fmt(value: Any, digits: int = 3) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def percent(value: float | None) -> str:
    return "–" if value is None else f"{100 * value:.1f} %"


def _bytes(value: int | None) -> str:
    if value is None:
        return "–"
    if value < 1024:
        return f"{value} B"
    amount = float(value)
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        amount /= 1024
        if amount < 1024 or unit == "TiB":
            break
    return f"{amount:.1f} {unit}"


def html_table(headers: Sequence[str], rows: Sequence[Sequence[Any]], text_columns: Sequence[int] = ()) -> str:
    body = "".join(html_row(row, text_columns) for row in rows)
    return f"<table><thead><tr>{html_head(headers, text_columns)}</tr></thead><tbody>{body}</tbody></table>"


def _headline(report: dict[str, Any], page: KindPage) -> str:
    rows = [
        ("state", report["state"]),
        *page.headline,
        ("wall time", f"{fmt(report['wall_s'], 2)} s"),
        ("slots", report["slots"]),
        ("parallel efficiency", percent(report["parallel_efficiency"])),
        (
            "tasks",
            f"{report['tasks_done']} done, {report['tasks_failed']} failed, {report['tasks_retried']} retried",
        ),
        *(
            (f"{task_type} tasks", f"{counts['done']} done, {counts['failed']} failed")
            for task_type, counts in report["tasks_by_type"].items()
        ),
        ("tasks per second", fmt(report["tasks_per_s"], 2)),
        ("task busy time", f"{fmt(report['task_busy_s'], 2)} s (summed over slots)"),
    ]
    return (
        '<table class="headline">'
        + "".join(
            f'<tr><td class="text">{escape(name)}</td><td class="text"><b>{escape(str(value))}</b></td></tr>'
            for name, value in rows
        )
        + "</table>"
    )


def _breakdown(report: dict[str, Any], page: KindPage) -> str:
    spent = report["time"]
    slots = report["slots"]
    capacity = (report["wall_s"] or 0) * slots

    def share(seconds: float | None) -> str:
        return "–" if not capacity or seconds is None else percent(seconds / capacity)

    rows = [
        ("model and data load (in tasks)", spent["load_s"], share(spent["load_s"])),
        ("computing (in tasks)", spent["compute_s"], share(spent["compute_s"])),
        # Only kinds whose tasks upload what they made (FL's updates) have this row.
        *(
            (("upload of updates (in tasks)", spent["upload_s"], share(spent["upload_s"])),)
            if spent["upload_s"]
            else ()
        ),
        ("other work inside tasks", spent["task_other_s"], share(spent["task_other_s"])),
        (
            "between tasks: result write, ack, next fetch",
            spent["between_tasks_s"],
            share(spent["between_tasks_s"]),
        ),
        *_idle_rows(spent, share),
        # A kind's phases (FL's aggregation, evaluation) run in one process while every slot waits: they cost
        # slots x their time.
        *((label, seconds, share(None if seconds is None else seconds * slots)) for label, seconds in page.breakdown),
    ]
    table = html_table(["where", "seconds", "share of slot time"], [(a, fmt(b), c) for a, b, c in rows], (0,))
    waits = f"queue wait per task: mean {fmt(spent['queue_wait_mean_s'])} s, max {fmt(spent['queue_wait_max_s'])} s"
    return (
        table + f'<p class="note">{escape(waits)}. Slot time = wall time × slots; '
        "task phases add up over slots running side by side.</p>"
    )


def _idle_rows(spent: dict[str, Any], share: Callable[[float | None], str]) -> list[tuple[str, Any, str]]:
    """The slots' idle time by what it waited on: workers starting while tasks were queued, tasks queued but not
    yet taken, nothing queued."""
    parts = [
        ("slots starting: before their first task, tasks queued", spent["slots_starting_s"]),
        ("slots idle while tasks waited in the queue", spent["idle_tasks_waiting_s"]),
        ("slots idle: nothing queued for them", spent["idle_nothing_queued_s"]),
    ]
    return [(label, seconds, share(seconds)) for label, seconds in parts]


def _job(report: dict[str, Any]) -> str:
    """The job kind's own numbers: scalars as one table, its per-worker rows as another."""
    job = report.get("job")
    if not job:
        return ""
    scalars = [(key, fmt(value, 4) if isinstance(value, float) else value) for key, value in job.items()]
    scalars = [(key, value) for key, value in scalars if isinstance(value, (str, int, float)) or value is None]
    parts = ["<h2>Job</h2>", html_table(["", "value"], [(key, "" if v is None else v) for key, v in scalars], (0, 1))]
    workers = job.get("workers") or []
    if workers:
        headers = list(workers[0])
        parts.append(html_table(headers, [tuple(row[h] for h in headers) for row in workers], (0,)))
    return "\n".join(parts) + "\n"


def _slowest(report: dict[str, Any]) -> str:
    rows = [
        (
            s["task"],
            s["worker"],
            s["pid"],
            s["device_used"],
            fmt(s["seconds"]),
            fmt(s["load_ms"], 1),
            fmt(s["compute_ms"], 1),
            fmt(s["upload_ms"], 1),
            s["attempt"],
        )
        for s in report["slowest"]
    ]
    headers = ["task", "worker", "pid", "device used", "seconds", "load ms", "compute ms", "upload ms", "attempt"]
    return html_table(headers, rows, (0, 1, 3))


def _utilization(report: dict[str, Any]) -> str:
    if not report["utilization"]:
        return (
            '<p class="note">No utilization samples for this run\'s workers yet '
            "(workers write them every few seconds).</p>"
        )
    rows = [
        (
            u["worker"],
            u["pid"],
            u["device_used"],
            u["samples"],
            fmt(u["utilization_mean"], 1),
            fmt(u["utilization_p95"], 1),
            _bytes(u["memory_peak_bytes"]),
        )
        for u in report["utilization"]
    ]
    table = html_table(["worker", "pid", "device", "samples", "mean %", "p95 %", "peak memory"], rows, (0, 2))
    return (
        table + '<p class="note">GPU: NVML utilization and board memory. CPU: the worker process\'s CPU % '
        "(100 = one core) and resident memory. One sample a second.</p>"
    )


def _timeline_alt(page: KindPage) -> str:
    """The timeline's description, naming rounds only for a kind that has them."""
    if not page.rounds:
        return "tasks per worker slot over time"
    return f"tasks per worker slot over time, coloured by {page.words.colour}, {page.words.aggregation}s dark"


def render_html(report: dict[str, Any], page: KindPage | None = None) -> str:
    page = page or KindPage()
    title = f"fedqueue run {report['id']}" + (f" ({report['name']})" if report["name"] else "")
    created = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(report["created_at"]))
    error = f'<p class="error">{escape(report["error"])}</p>' if report["error"] else ""
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{escape(title)}</title><style>{STYLE}</style></head>
<body>
<h1>{escape(title)}</h1>
<p class="note">submitted {escape(created)}</p>
{error}
{_headline(report, page)}
<p class="note">{escape(report["slots_note"])}. {escape(report["efficiency_note"])}.</p>
{page.top}<h2>Timeline</h2>
<img src="timeline.png" alt="{escape(_timeline_alt(page))}">
<img src="concurrency.png" alt="tasks running at once against the number of slots">
<h2>Where the time went</h2>
{_breakdown(report, page)}
{_job(report)}{page.sections}
<h2>Slowest tasks</h2>
{_slowest(report)}
<h2>Device utilization</h2>
{_utilization(report)}
</body></html>
"""
