"""`fedqueue runs` as a table that fits the terminal: each run recognisable at 80 columns.

A line says what the run is (its kind, FL's mode or an LLM job's chat or plain prompts), a name shortened in the
middle so both its ends stay (`digits-fedavg` and `digits-fedbuff` stay apart), how far it got, its latest
accuracy, its state (`stalled` when nothing schedules a running run) and its age. Ids and states are never
shortened; the other columns are left out, least telling first, when even shortened they do not fit.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from rich import box
from rich.cells import cell_len
from rich.table import Table
from rich.text import Text

# (column, its header); "what" is the data and model (FL) or the model (LLM).
COLUMNS = (
    ("id", "id"),
    ("type", "kind"),
    ("name", "name"),
    ("what", "data · model"),
    ("progress", "progress"),
    ("accuracy", "acc"),
    ("state", "state"),
    ("age", "age"),
)
ALWAYS = ("id", "state")  # never shortened or left out
# The others, left out in this order while even shortened they do not fit.
DROPPED_FIRST = ("what", "age", "accuracy", "progress", "name", "type")
SHORTENED = ("name", "what")  # cut to fit, with an ellipsis
KEEP_END = ("what",)  # paths and hub names: their end tells most (the file, the model)
RIGHT = ("progress", "accuracy", "age")
MIN_SHORTENED = 8  # narrower than this, a shortened column is left out instead
GAP = 2  # cells between two columns (no rule, no outer edge)
ELLIPSIS = "…"
STALLED = "stalled"


def runs_table(lines: Sequence[dict[str, Any]], width: int, now: float | None = None) -> Table:
    """The table of `lines` (`fedqueue.api.runs()`) at most `width` cells wide, where the columns that must stay
    whole fit in it."""
    now = time.time() if now is None else now
    cells = [_cells(line, now) for line in lines]
    headers = dict(COLUMNS)
    natural = {column: max([cell_len(header), *(cell_len(row[column]) for row in cells)]) for column, header in COLUMNS}
    # A column no line fills says nothing: an LLM-only store has no accuracy.
    shown = [column for column, _ in COLUMNS if column in ALWAYS or any(row[column] for row in cells)]
    widths = _fit(shown, natural, width)
    while widths is None and any(column in shown for column in DROPPED_FIRST):
        shown.remove(next(column for column in DROPPED_FIRST if column in shown))
        widths = _fit(shown, natural, width)
    if widths is None:  # too narrow even for the columns kept whole: they stay whole, the terminal wraps them
        widths = {column: natural[column] for column in shown}
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, padding=(0, GAP - 1, 0, 0))
    for column in shown:
        # The columns kept whole never wrap; a shortened one may, so that rich narrows it before any other.
        table.add_column(
            headers[column],
            no_wrap=column not in SHORTENED,
            justify="right" if column in RIGHT else "left",
            min_width=widths[column] if column in ALWAYS else None,
        )
    for row in cells:
        table.add_row(*(Text(_shorten(row[column], widths[column], column)) for column in shown))
    return table


def stalled_note(lines: Sequence[dict[str, Any]]) -> str | None:
    """The line under the table that says what `stalled` means, when a run is."""
    if not any(line.get("stalled") for line in lines):
        return None
    return f"{STALLED}: running, but nothing schedules it; fedqueue resume RUN carries it on"


def _cells(line: dict[str, Any], now: float) -> dict[str, str]:
    what = " · ".join(str(part) for part in (line.get("dataset"), line.get("model")) if part)
    accuracy = line.get("accuracy")
    values = {
        **line,
        "name": line.get("name") or "",
        "what": what,
        "accuracy": "" if accuracy is None else f"{accuracy:.3f}",
        "state": STALLED if line.get("stalled") else line["state"],
        "age": age(now - line["created_at"]),
    }
    return {column: "" if values.get(column) is None else str(values[column]) for column, _ in COLUMNS}


def age(seconds: float) -> str:
    """How long ago, in its largest whole unit: 40s, 12m, 5h, 3d."""
    seconds = max(0.0, seconds)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{int(seconds // size)}{unit}"
    return f"{int(seconds)}s"


def _fit(shown: list[str], natural: dict[str, int], width: int) -> dict[str, int] | None:
    """Each shown column's width, the shortened ones sharing what the others leave; None if they do not fit."""
    room = width - GAP * (len(shown) - 1)
    fixed = {column: natural[column] for column in shown if column not in SHORTENED}
    flexible = [column for column in shown if column in SHORTENED]
    left = room - sum(fixed.values())
    widths = dict(fixed)
    # Water-filling: the narrow ones whole, the rest an equal share of what is left.
    for count, column in enumerate(sorted(flexible, key=lambda name: natural[name]), start=0):
        share = left // (len(flexible) - count)
        widths[column] = min(natural[column], share)
        left -= widths[column]
    if left < 0 or any(widths[column] < min(MIN_SHORTENED, natural[column]) for column in flexible):
        return None
    return widths


def _shorten(value: str, width: int, column: str) -> str:
    """`value` in at most `width` cells: a path's end kept, a name's both ends."""
    if cell_len(value) <= width:
        return value
    if column in KEEP_END:
        return ELLIPSIS + _cut(value[::-1], width - 1)[::-1]
    # The end gets the odd cell: it tells runs of one family apart (their mode, a seed).
    head = _cut(value, (width - 1) // 2)
    tail = _cut(value[::-1], (width - 1) - (width - 1) // 2)[::-1]
    return head + ELLIPSIS + tail


def _cut(value: str, cells: int) -> str:
    """The longest start of `value` that takes at most `cells` cells."""
    kept = value
    while cell_len(kept) > cells:
        kept = kept[:-1]
    return kept
