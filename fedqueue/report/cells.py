"""The pieces of the report's HTML pages: their style, a table's header and its rows, every value escaped."""

from __future__ import annotations

from collections.abc import Sequence
from html import escape
from typing import Any

STYLE = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 24px auto; max-width: 1320px; color: #222; padding: 0 16px; }
h1 { font-size: 22px; margin-bottom: 4px; } h2 { font-size: 17px; margin-top: 30px; }
table { border-collapse: collapse; margin: 8px 0; font-variant-numeric: tabular-nums; }
th, td { padding: 3px 9px; border-bottom: 1px solid #e3e3e3; text-align: right; white-space: nowrap; }
th { background: #f4f4f4; } td.text, th.text { text-align: left; }
tr.gap td { color: #888; text-align: center; }
.headline td { font-size: 15px; } .note { color: #666; font-size: 12px; } .error { color: #b00; }
img { max-width: 100%; border: 1px solid #eee; margin: 6px 0; }
"""


def html_head(headers: Sequence[str], text_columns: Sequence[int] = ()) -> str:
    """A table's header cells; those of `text_columns` left-aligned."""
    return "".join(
        f'<th class="text">{escape(name)}</th>' if index in text_columns else f"<th>{escape(name)}</th>"
        for index, name in enumerate(headers)
    )


def html_row(row: Sequence[Any], text_columns: Sequence[int] = ()) -> str:
    """A table's row, every cell escaped."""
    cells = "".join(
        f'<td class="text">{escape(str(cell))}</td>' if index in text_columns else f"<td>{escape(str(cell))}</td>"
        for index, cell in enumerate(row)
    )
    return f"<tr>{cells}</tr>"
