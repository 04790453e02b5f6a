"""report.html: the pictures (referenced relatively, beside the page) and the tables. Every value is escaped."""

from __future__ import annotations

import time
from collections.abc import Sequence
from html import escape
from typing import Any

STYLE = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 24px auto; max-width: 1320px; color: #222; padding: 0 16px; }
h1 { font-size: 22px; margin-bottom: 4px; } h2 { font-size: 17px; margin-top: 30px; }
table { border-collapse: collapse; margin: 8px 0; font-variant-numeric: tabular-nums; }
th, td { padding: 3px 9px; border-bottom: 1px solid #e3e3e3; text-align: right; white-space: nowrap; }
th { background: #f4f4f4; } td.text, th.text { text-align: left; }
.headline td { font-size: 15px; } .note { color: #666; font-size: 12px; } .error { color: #b00; }
img { max-width: 100%; border: 1px solid #eee; margin: 6px 0; }
"""


def _fmt(value: Any, digits: int = 3) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def _pct(value: float | None) -> str:
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


def _table(headers: Sequence[str], rows: Sequence[Sequence[Any]], text_columns: Sequence[int] = ()) -> str:
    head = "".join(
        f'<th class="text">{escape(name)}</th>' if index in text_columns else f"<th>{escape(name)}</th>"
        for index, name in enumerate(headers)
    )
    body = "".join(
        "<tr>"
        + "".join(
            f'<td class="text">{escape(str(cell))}</td>' if index in text_columns else f"<td>{escape(str(cell))}</td>"
            for index, cell in enumerate(row)
        )
        + "</tr>"
        for row in rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _headline(report: dict[str, Any]) -> str:
    rows = [
        ("state", report["state"]),
        ("rounds", f"{report['rounds_done']} of {report['rounds_total']} done"),
        ("dataset / model", f"{report['dataset']} / {report['model']}"),
        *_packing_rows(report.get("packing")),
        ("wall time", f"{_fmt(report['wall_s'], 2)} s"),
        ("slots", report["slots"]),
        ("parallel efficiency", _pct(report["parallel_efficiency"])),
        (
            "tasks",
            f"{report['tasks_done']} done, {report['tasks_failed']} failed, {report['tasks_retried']} retried",
        ),
        *(
            (f"{task_type} tasks", f"{counts['done']} done, {counts['failed']} failed")
            for task_type, counts in report["tasks_by_type"].items()
        ),
        ("tasks per second", _fmt(report["tasks_per_s"], 2)),
        ("task busy time", f"{_fmt(report['task_busy_s'], 2)} s (summed over slots)"),
    ]
    return (
        '<table class="headline">'
        + "".join(
            f'<tr><td class="text">{escape(name)}</td><td class="text"><b>{escape(str(value))}</b></td></tr>'
            for name, value in rows
        )
        + "</table>"
    )


def _packing_rows(packing: dict[str, Any] | None) -> list[tuple[str, str]]:
    if not packing or packing["pack_size"] == 1:
        return []
    rows = [("packs", f"{packing['pack_size']} devices per task, {packing['pack_mode']}")]
    if packing.get("chosen"):
        rows.append(("packs chosen by auto", packing["chosen"]))
    return rows


def _breakdown(report: dict[str, Any]) -> str:
    spent = report["time"]
    slots = report["slots"]
    capacity = (report["wall_s"] or 0) * slots

    def share(seconds: float | None) -> str:
        return "–" if not capacity or seconds is None else _pct(seconds / capacity)

    rows = [
        ("model and data load (in tasks)", spent["load_s"], share(spent["load_s"])),
        ("computing (in tasks)", spent["compute_s"], share(spent["compute_s"])),
        ("upload of updates (in tasks)", spent["upload_s"], share(spent["upload_s"])),
        ("other work inside tasks", spent["task_other_s"], share(spent["task_other_s"])),
        (
            "between tasks: result write, round check, ack, next fetch",
            spent["between_tasks_s"],
            share(spent["between_tasks_s"]),
        ),
        ("slots idle: nothing queued for them", spent["slots_idle_s"], share(spent["slots_idle_s"])),
        # Aggregation and evaluation run in one process while every slot waits: they cost slots x their time.
        ("of which aggregation (one process)", spent["aggregation_s"], share(spent["aggregation_s"] * slots)),
        ("of which evaluation (one process)", spent["evaluation_s"], share(spent["evaluation_s"] * slots)),
    ]
    table = _table(["where", "seconds", "share of slot time"], [(a, _fmt(b), c) for a, b, c in rows], (0,))
    waits = f"queue wait per task: mean {_fmt(spent['queue_wait_mean_s'])} s, max {_fmt(spent['queue_wait_max_s'])} s"
    return (
        table + f'<p class="note">{escape(waits)}. Slot time = wall time × slots; '
        "task phases add up over slots running side by side.</p>"
    )


def _rounds(report: dict[str, Any]) -> str:
    headers = [
        "round",
        "state",
        "selected",
        "done",
        "failed",
        "retried",
        "wall s",
        "queue wait s (mean)",
        "load s",
        "compute s",
        "upload s",
        "between tasks s",
        "slots idle s",
        "aggregation s",
        "evaluation s",
        "efficiency",
        "tasks/s",
        "accuracy",
        "loss",
    ]
    rows = [
        (
            r["round"],
            r["state"],
            r["selected"],
            r["done"],
            r["failed"],
            r["retried"],
            _fmt(r["wall_s"]),
            _fmt(r["time"]["queue_wait_mean_s"]),
            _fmt(r["time"]["load_s"]),
            _fmt(r["time"]["compute_s"]),
            _fmt(r["time"]["upload_s"]),
            _fmt(r["time"]["between_tasks_s"]),
            _fmt(r["time"]["slots_idle_s"]),
            _fmt(r["time"]["aggregation_s"]),
            _fmt(r["time"]["evaluation_s"]),
            _pct(r["parallel_efficiency"]),
            _fmt(r["tasks_per_s"], 1),
            _fmt(r["accuracy"], 4),
            _fmt(r["loss"], 4),
        )
        for r in report["rounds"]
    ]
    return _table(headers, rows, (1,))


def _rounds_section(report: dict[str, Any]) -> str:
    if not report["rounds"]:  # a job kind without rounds (LLM batches)
        return ""
    return f"""<h2>Rounds</h2>
{_rounds(report)}
<img src="accuracy.png" alt="accuracy and loss per round">
"""


def _simulated(report: dict[str, Any]) -> str:
    simulated = report.get("simulated")
    if not simulated:
        return ""
    rows = [
        ("simulated seconds", _fmt(simulated["sim_s"], 1)),
        ("wall seconds", _fmt(simulated["wall_s"], 2)),
        ("simulated seconds per wall second", _fmt(simulated["sim_per_wall_s"], 1)),
    ]
    buffered = simulated.get("buffered")
    if buffered:
        rows += [
            ("updates folded", buffered["folded"]),
            ("updates dropped as stale", buffered["stale"]),
            ("updates failed", buffered["failed"]),
        ]
    return f"""<h2>Simulated time</h2>
{_table(["", "value"], rows, (0,))}
<p class="note">Device speeds and delays are modelled from the seed, never slept: workers train back to back
while the run's clock advances by the modelled times.</p>
<img src="simulated.png" alt="accuracy against simulated time">
"""


def _job(report: dict[str, Any]) -> str:
    """The job kind's own numbers: scalars as one table, its per-worker rows as another."""
    job = report.get("job")
    if not job:
        return ""
    scalars = [(key, _fmt(value, 4) if isinstance(value, float) else value) for key, value in job.items()]
    scalars = [(key, value) for key, value in scalars if isinstance(value, (str, int, float)) or value is None]
    parts = ["<h2>Job</h2>", _table(["", "value"], [(key, "" if v is None else v) for key, v in scalars], (0, 1))]
    workers = job.get("workers") or []
    if workers:
        headers = list(workers[0])
        parts.append(_table(headers, [tuple(row[h] for h in headers) for row in workers], (0,)))
    return "\n".join(parts) + "\n"


def _slowest(report: dict[str, Any]) -> str:
    rows = [
        (
            s["task"],
            s["worker"],
            s["pid"],
            s["device_used"],
            _fmt(s["seconds"]),
            _fmt(s["load_ms"], 1),
            _fmt(s["compute_ms"], 1),
            _fmt(s["upload_ms"], 1),
            s["attempt"],
        )
        for s in report["slowest"]
    ]
    headers = ["task", "worker", "pid", "device used", "seconds", "load ms", "compute ms", "upload ms", "attempt"]
    return _table(headers, rows, (0, 1, 3))


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
            _fmt(u["utilization_mean"], 1),
            _fmt(u["utilization_p95"], 1),
            _bytes(u["memory_peak_bytes"]),
        )
        for u in report["utilization"]
    ]
    table = _table(["worker", "pid", "device", "samples", "mean %", "p95 %", "peak memory"], rows, (0, 2))
    return (
        table + '<p class="note">GPU: NVML utilization and board memory. CPU: the worker process\'s CPU % '
        "(100 = one core) and resident memory. One sample a second.</p>"
    )


def render_html(report: dict[str, Any]) -> str:
    title = f"fedqueue run {report['id']}" + (f" ({report['name']})" if report["name"] else "")
    created = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(report["created_at"]))
    error = f'<p class="error">{escape(report["error"])}</p>' if report["error"] else ""
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{escape(title)}</title><style>{STYLE}</style></head>
<body>
<h1>{escape(title)}</h1>
<p class="note">submitted {escape(created)}</p>
{error}
{_headline(report)}
<p class="note">{escape(report["slots_note"])}.</p>
<h2>Timeline</h2>
<img src="timeline.png" alt="tasks per worker slot over time, coloured by round, aggregations dark">
<img src="concurrency.png" alt="tasks running at once against the number of slots">
<h2>Where the time went</h2>
{_breakdown(report)}
{_job(report)}{_rounds_section(report)}{_simulated(report)}
<h2>Slowest tasks</h2>
{_slowest(report)}
<h2>Device utilization</h2>
{_utilization(report)}
</body></html>
"""
