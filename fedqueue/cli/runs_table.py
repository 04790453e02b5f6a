"""`fedqueue runs` as a table that fits the terminal: ids, states and dates in full, the rest shortened or left out."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from rich import box
from rich.cells import cell_len
from rich.table import Table
from rich.text import Text

COLUMNS = ("id", "name", "state", "rounds", "data", "model", "created")
ALWAYS = ("id", "state", "created")  # never shortened or left out
# The others, left out in this order while even shortened they do not fit.
DROPPED_FIRST = ("data", "model", "rounds", "name")
SHORTENED = ("name", "data", "model")  # cut to fit, with an ellipsis
KEEP_END = ("data", "model")  # paths and hub names: their end tells most (the file, the model)
MIN_SHORTENED = 8  # narrower than this, a shortened column is left out instead
ELLIPSIS = "…"


def runs_table(lines: Sequence[dict[str, Any]], width: int) -> Table:
    """The table of `lines` (`fedqueue.api.runs()`) at most `width` cells wide, where the columns that must stay
    whole fit in it."""
    cells = [_cells(line) for line in lines]
    natural = {column: max([cell_len(column), *(cell_len(row[column]) for row in cells)]) for column in COLUMNS}
    shown = list(COLUMNS)
    widths = _fit(shown, natural, width)
    while widths is None and any(column in shown for column in DROPPED_FIRST):
        shown.remove(next(column for column in DROPPED_FIRST if column in shown))
        widths = _fit(shown, natural, width)
    if widths is None:  # too narrow even for the columns kept whole: they stay whole, the terminal wraps them
        widths = {column: natural[column] for column in shown}
    table = Table(box=box.SIMPLE, show_edge=False, pad_edge=False)
    for column in shown:
        # The columns kept whole never wrap; a shortened one may, so that rich narrows it before any other.
        table.add_column(
            column, no_wrap=column not in SHORTENED, min_width=widths[column] if column in ALWAYS else None
        )
    for row in cells:
        table.add_row(*(Text(_shorten(row[column], widths[column], column in KEEP_END)) for column in shown))
    return table


def _cells(line: dict[str, Any]) -> dict[str, str]:
    created = time.strftime("%m-%d %H:%M", time.localtime(line["created_at"]))
    values = {**line, "data": line.get("dataset"), "created": created}
    return {column: "" if values.get(column) is None else str(values[column]) for column in COLUMNS}


def _fit(shown: list[str], natural: dict[str, int], width: int) -> dict[str, int] | None:
    """Each shown column's width, the shortened ones sharing what the others leave; None if they do not fit."""
    # A column takes its text and one cell of padding each side; one cell of rule between two columns.
    # The outer edges have neither padding nor rule.
    room = width - (3 * len(shown) - 3)
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


def _shorten(value: str, width: int, keep_end: bool) -> str:
    if cell_len(value) <= width:
        return value
    if keep_end:
        kept = value
        while cell_len(kept) > width - 1:
            kept = kept[1:]
        return ELLIPSIS + kept
    kept = value
    while cell_len(kept) > width - 1:
        kept = kept[:-1]
    return kept + ELLIPSIS
