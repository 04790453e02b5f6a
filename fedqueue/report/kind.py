"""A job kind's part of a run's status, report and `fedqueue runs` line, over the report's own types.

A kind adds these hooks by deriving from `KindViews` beside `fedqueue.core.jobs.JobKind`; the report reaches a
run's through `views_of`, and a kind without them (or one not installed here) gets the core's numbers alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from fedqueue.core import jobs
from fedqueue.report.html import KindPage

if TYPE_CHECKING:
    from fedqueue.report.run_data import RunData
    from fedqueue.report.timeline import Span
    from fedqueue.store import Store
    from fedqueue.store.schema import RunRow


class KindViews:
    """What a kind adds to the core's views of its runs; each default adds nothing."""

    def summary(self, store: Store, run: RunRow, spans: Sequence[Span]) -> dict[str, Any]:
        """Keys merged over the core's in a run's status (`fedqueue status RUN --json`, `RunHandle.status()`)."""
        return {}

    def report_numbers(self, store: Store, data: RunData, numbers: dict[str, Any]) -> dict[str, Any]:
        """Numbers merged over the core's in `fedqueue report` (the kind's own section goes under "job")."""
        return {}

    def report_page(self, numbers: dict[str, Any]) -> KindPage:
        """The kind's part of report.html: headline rows, sections, rounds to mark on the timeline, pictures."""
        return KindPage()

    def run_columns(self, store: Store, runs: Sequence[RunRow]) -> dict[str, dict[str, Any]]:
        """The kind's columns of `fedqueue runs` (type, progress, dataset, model) for its runs: {run id: columns}."""
        return {}


_NO_VIEWS = KindViews()


def views_of(kind_name: str) -> KindViews:
    """The views of an installed kind by its name; the core's alone for a kind without them."""
    kind = jobs.kinds().get(kind_name)
    return kind if isinstance(kind, KindViews) else _NO_VIEWS
