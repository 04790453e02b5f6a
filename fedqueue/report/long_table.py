"""A table of one row per round or version, however long: report.html shows a summary of it (every row of a short
table; of a long one its first and last rows and every k-th between), and every row goes beside the page, in a
CSV of the unrounded numbers and in HTML pages of PAGE_ROWS rows each."""

from __future__ import annotations

import csv
import math
from collections.abc import Sequence
from dataclasses import dataclass
from html import escape
from pathlib import Path
from typing import Any

from fedqueue.report.cells import STYLE, html_head, html_row

SHOWN_WHOLE = 60  # a table of up to this many rows is shown whole in the report
ENDS = 10  # a longer one shows its first and last ENDS rows,
BETWEEN = 40  # and at most about this many evenly spaced rows between them
PAGE_ROWS = 1000  # rows per page of the whole table


@dataclass(frozen=True)
class LongTable:
    """A table with a row per step of a run: cells to show (formatted) and the numbers behind them (for the CSV)."""

    stem: str  # its files: STEM.csv, STEM-1.html, STEM-2.html, ...
    word: str  # what a row is: "round", "version"
    headers: Sequence[str]
    rows: Sequence[Sequence[Any]]  # formatted cells, as the report shows them
    csv_headers: Sequence[str]
    csv_rows: Sequence[Sequence[Any]]  # the unrounded numbers, one row per row of `rows`
    text_columns: Sequence[int] = ()

    @property
    def folded(self) -> bool:
        return len(self.rows) > SHOWN_WHOLE

    @property
    def pages(self) -> int:
        return max(1, math.ceil(len(self.rows) / PAGE_ROWS)) if self.folded else 0

    @property
    def csv_name(self) -> str:
        return f"{self.stem}.csv"

    def page_name(self, page: int) -> str:
        return f"{self.stem}-{page}.html"


def nice_step(at_least: float) -> int:
    """The smallest 1, 2 or 5 times a power of ten that is at least `at_least` (every 500th reads better than
    every 499th)."""
    power = 1
    while True:
        for factor in (1, 2, 5):
            if factor * power >= at_least:
                return factor * power
        power *= 10


def shown_rows(count: int) -> tuple[list[int], int]:
    """The positions of the rows the report shows, and the step between the middle ones (1: every row)."""
    if count <= SHOWN_WHOLE:
        return list(range(count)), 1
    step = nice_step((count - 2 * ENDS) / BETWEEN)
    # Positions from 0: the middle rows are every step-th row counting from 1 (versions 500, 1000, ...).
    middle = range(step - 1, count - ENDS, step)
    return sorted({*range(ENDS), *middle, *range(count - ENDS, count)}), step


def _table(table: LongTable, positions: Sequence[int]) -> str:
    """The rows at `positions` (ascending), with a dim row saying how many were left out wherever some were."""
    body: list[str] = []
    previous = -1
    for position in positions:
        skipped = position - previous - 1
        if skipped:
            body.append(
                f'<tr class="gap"><td colspan="{len(table.headers)}" class="text">… {skipped:,} {table.word}s …</td></tr>'
            )
        body.append(html_row(table.rows[position], table.text_columns))
        previous = position
    head = html_head(table.headers, table.text_columns)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def summary_html(table: LongTable) -> str:
    """The table as report.html shows it, with where every row is."""
    positions, step = shown_rows(len(table.rows))
    csv_link = f'<a href="{escape(table.csv_name)}">{escape(table.csv_name)}</a>'
    if not table.folded:
        note = f"Every {table.word} as numbers, unrounded: {csv_link}."
        return _table(table, positions) + f'\n<p class="note">{note}</p>'
    count = len(table.rows)
    pages = ", ".join(
        f'<a href="{escape(table.page_name(page))}">{_page_range(table, page)}</a>'
        for page in range(1, table.pages + 1)
    )
    note = (
        f"{count:,} {table.word}s: shown are the first {ENDS}, the last {ENDS} and every {step:,}th between."
        f" Every {table.word}: {csv_link} (the numbers, unrounded), or as this table, {PAGE_ROWS:,} a page: {pages}."
    )
    return f'<p class="note">{note}</p>\n' + _table(table, positions)


def _page_range(table: LongTable, page: int) -> str:
    """The first and last row of a page, as their first cells (the round or version numbers)."""
    first = (page - 1) * PAGE_ROWS
    last = min(len(table.rows), page * PAGE_ROWS) - 1
    return f"{escape(str(table.rows[first][0]))}–{escape(str(table.rows[last][0]))}"


def write_table_files(table: LongTable, folder: Path, title: str) -> None:
    """The CSV of every row, and for a folded table its pages, each linking the report and the other pages."""
    with (folder / table.csv_name).open("w", newline="", encoding="utf-8") as file:
        writer = csv.writer(file)
        writer.writerow(table.csv_headers)
        writer.writerows(["" if value is None else value for value in row] for row in table.csv_rows)
    for page in range(1, table.pages + 1):
        (folder / table.page_name(page)).write_text(_page(table, page, title), encoding="utf-8")


def _page(table: LongTable, page: int, title: str) -> str:
    links = ['<a href="report.html">report</a>', f'<a href="{escape(table.csv_name)}">{escape(table.csv_name)}</a>']
    for other in range(1, table.pages + 1):
        label = _page_range(table, other)
        links.append(f"<b>{label}</b>" if other == page else f'<a href="{escape(table.page_name(other))}">{label}</a>')
    nav = f'<p class="note">{" · ".join(links)}</p>'
    rows = range((page - 1) * PAGE_ROWS, min(len(table.rows), page * PAGE_ROWS))
    heading = f"{title}: {table.word}s {_page_range(table, page)}"
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{escape(heading)}</title><style>{STYLE}</style></head>
<body>
<h1>{escape(heading)}</h1>
{nav}
{_table(table, rows)}
{nav}
</body></html>
"""
