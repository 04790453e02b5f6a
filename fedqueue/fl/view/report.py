"""An FL run's part of the report: numbers per round, aggregation and evaluation time, simulated time, and its
page (headline rows, the rounds table, accuracy and simulated-time pictures). The core's report gets them
through the FL kind's hooks (`JobKind.report_numbers`, `JobKind.report_page`)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fedqueue.fl.store.results import DeviceOutcome, device_outcomes, list_rounds
from fedqueue.fl.store.schema import RoundRow
from fedqueue.fl.store.stop_rows import get_stop
from fedqueue.fl.strategy.mode import ROUNDS, VERSIONS, Unit
from fedqueue.fl.view.summary import buffered_of, mode_of, packing_of
from fedqueue.report.html import KindPage, fmt, html_table, percent
from fedqueue.report.long_table import LongTable, summary_html
from fedqueue.report.numbers import rounded, time_breakdown
from fedqueue.report.run_data import RunData
from fedqueue.report.timeline import Lane, RoundMark, RoundWords, Span, parallel_efficiency
from fedqueue.store import Store


def report_numbers(store: Store, data: RunData, numbers: dict[str, Any]) -> dict[str, Any]:
    """The FL keys of a run's report, read from its rounds and, for a buffered-async run, its updates."""
    run = data.run
    results = device_outcomes(store, run.id)
    buffered = buffered_of(run, results)
    stop = get_stop(store, run.id)
    return {
        **rounds_report(data, list_rounds(store, run.id), buffered, numbers),
        "stop": stop and stop.reason,
        "tasks_counted": device_task_count(results, data.spans),
    }


def device_task_count(results: Sequence[DeviceOutcome], spans: Sequence[Span]) -> dict[str, Any]:
    """Device tasks as `fedqueue status` counts them (one per device trained, from their results), and the packs
    that trained `packed` of them together (the core's timed tasks count a vmapped pack once)."""
    done = sum(1 for result in results if result.state == "done")
    packed = [span for span in spans if span.task_type == "train" and span.state == "done" and span.pack is not None]
    return {
        "what": "device tasks",
        "done": done,
        "failed": len(results) - done,
        "packs": len({(span.round_index, span.pack) for span in packed}),
        "packed": sum(span.devices for span in packed),
    }


def rounds_report(
    data: RunData, rounds: Sequence[RoundRow], buffered: dict[str, Any], numbers: dict[str, Any]
) -> dict[str, Any]:
    """The FL keys of a run's report from its rows; no I/O. `buffered` is `summary.buffered_of`'s."""
    run, spans = data.run, data.spans
    lanes = data.lanes
    slots = len(lanes)
    wall_s = max(0.0, data.end - run.created_at)
    done = [span for span in spans if span.state == "done"]
    by_round: dict[int | None, list[Span]] = defaultdict(list)
    for span in spans:
        by_round[span.round_index].append(span)
    lanes_by_round = lanes_of_rounds(lanes)
    return {
        "dataset": run.config.get("dataset"),
        "model": run.config.get("model"),
        # A buffered-async run's rounds are its versions: round r is made into version r.
        "buffered": mode_of(run).asynchronous,
        **packing_of(run),
        "rounds_total": run.rounds_total,
        "rounds_done": sum(1 for row in rounds if row.state == "done"),
        "devices_trained": sum(span.devices for span in done if span.task_type == "train"),
        "time": {**numbers["time"], **one_process_seconds(rounds)},
        "rounds": [
            round_numbers(
                row, by_round.get(row.round_index, []), lanes_by_round.get(row.round_index, []), slots, data.now
            )
            for row in rounds
        ],
        "simulated": simulated_numbers(run.config, rounds, buffered, wall_s),
    }


def one_process_seconds(rounds: Sequence[RoundRow]) -> dict[str, float | None]:
    """Aggregation and evaluation: run in one process while every slot waits."""
    return {
        "aggregation_s": rounded(sum(row.aggregate_ms or 0.0 for row in rounds) / 1000),
        "evaluation_s": rounded(sum(row.eval_ms or 0.0 for row in rounds) / 1000),
    }


def simulated_numbers(
    config: dict[str, Any], rounds: Sequence[RoundRow], buffered: dict[str, Any], wall_s: float
) -> dict[str, Any] | None:
    """Simulated against wall time, where the run models device speeds; a buffered-async run's updates."""
    if not (
        buffered
        or config.get("device_speed")
        or config.get("communication_delay")
        or config.get("clock", "per_sample") != "per_sample"
    ):
        return None
    clock = [(row.round_index, row.sim_time) for row in rounds if row.sim_time is not None]
    sim_s = clock[-1][1] if clock else None
    return {
        "sim_s": rounded(sim_s),
        "wall_s": rounded(wall_s),
        # How much simulated time one second of wall time covered.
        "sim_per_wall_s": rounded(sim_s / wall_s if sim_s is not None and wall_s > 0 else None),
        "sim_time": {str(index): rounded(at) for index, at in clock},
        **buffered,
    }


def lanes_of_rounds(lanes: Sequence[Lane]) -> dict[int | None, list[Lane]]:
    """Each round's part of the run's lanes: the lanes holding its tasks, with only its tasks, in one pass over
    the tasks (a run of 10,000 versions and 100,000 tasks would take 10^9 steps filtering every lane per round)."""
    parts: dict[int | None, list[Lane]] = defaultdict(list)
    for lane in lanes:
        mine: dict[int | None, list[Span]] = defaultdict(list)
        for span in lane.spans:
            mine[span.round_index].append(span)
        for round_index, spans in mine.items():
            parts[round_index].append(Lane(lane.worker, lane.pid, lane.device_used, lane.slot, tuple(spans)))
    return parts


def round_numbers(
    row: RoundRow, spans: Sequence[Span], round_lanes: Sequence[Lane], slots: int, now: float
) -> dict[str, Any]:
    """A round's numbers from its tasks and `round_lanes`, the lanes' parts holding them (`lanes_of_rounds`)."""
    done = [span for span in spans if span.state == "done"]
    end = row.aggregated_at
    if end is None:
        # Still training or aggregating: measured up to now.
        end = max(now, max((span.finished_at for span in spans), default=row.enqueued_at))
    wall_s = max(0.0, end - row.enqueued_at)
    busy_s = sum(span.busy_s for span in done)
    # The round's own tasks, beside the aggregation that closes it.
    work = [span for span in spans if span.task_type != "aggregate"]
    work_done = [span for span in work if span.state == "done"]
    return {
        "round": row.round_index,
        "state": row.state,
        "selected": len(row.selected),
        "done": len(work_done),
        "failed": len(work) - len(work_done),
        "retried": sum(1 for span in work if span.attempt > 1),
        "enqueued_at": row.enqueued_at,
        "wall_s": rounded(wall_s),
        "parallel_efficiency": rounded(parallel_efficiency(busy_s, wall_s, slots), 4),
        "tasks_per_s": rounded(len(done) / wall_s if wall_s > 0 else None),
        "time": {**time_breakdown(done, round_lanes, wall_s * slots), **one_process_seconds([row])},
        "accuracy": row.accuracy,
        "loss": row.loss,
        "train_loss": row.train_loss,
        "aggregated_at": row.aggregated_at,
        "sim_time": row.sim_time,
    }


# report.html and the pictures


def report_page(report: dict[str, Any]) -> KindPage:
    """The FL part of report.html, from the report's numbers."""
    spent = report["time"]
    word = _word(report)
    table = rounds_table(report) if report["rounds"] else None

    def draw(folder: Path, name: str) -> None:
        # matplotlib: loaded when a page is drawn
        from fedqueue.fl.view import plots

        title = f"{name}: accuracy and loss per {word}"
        plots.accuracy(folder / "accuracy.png", report["rounds"], title=title, word=word)
        if report["simulated"] is not None:
            staleness = report["simulated"].get("buffered", {}).get("staleness")
            plots.simulated(folder / "simulated.png", report["rounds"], staleness, title=f"{name}: simulated time")

    return KindPage(
        headline=[
            (f"{word}s", _rounds_done(report)),
            *_device_tasks_row(report.get("tasks_counted")),
            *([("stopped", report["stop"])] if report.get("stop") else []),
            ("dataset / model", f"{report['dataset']} / {report['model']}"),
            *_packing_rows(report.get("packing")),
        ],
        breakdown=[
            ("of which aggregation (one process)", spent["aggregation_s"]),
            ("of which evaluation (one process)", spent["evaluation_s"]),
        ],
        top=_curves(report),
        sections=_rounds_section(report, table) + _simulated(report),
        rounds=[RoundMark(r["round"], r["enqueued_at"], r["aggregated_at"]) for r in report["rounds"]],
        words=BUFFERED_WORDS if report.get("buffered") else RoundWords(),
        draw=draw,
        tables=[] if table is None else [table],
    )


# A buffered run's task of round r trained on version r - 1, published when round r was opened.
BUFFERED_WORDS = RoundWords(
    colour="version trained on", mark="v", marked="version published", aggregation="fold pass", shift=-1
)


def _unit(report: dict[str, Any]) -> Unit:
    # The page reads the report's numbers alone (a saved report.json too), where "buffered" names the unit.
    return VERSIONS if report.get("buffered") else ROUNDS


def _word(report: dict[str, Any]) -> str:
    return _unit(report).singular


def _rounds_done(report: dict[str, Any]) -> str:
    made = _unit(report).made
    # No total: a buffered run bounded by max_sim_time alone.
    if not report["rounds_total"]:
        return f"{report['rounds_done']} {made}"
    return f"{report['rounds_done']} of {report['rounds_total']} {made}"


def _device_tasks_row(counted: dict[str, Any] | None) -> list[tuple[str, str]]:
    if not counted:
        return []
    return [(counted["what"], f"{counted['done']} done, {counted['failed']} failed{packed_in(counted)}")]


def packed_in(counted: dict[str, Any]) -> str:
    """ ", in 50 packs" when every device task trained in one, else ", 6 of them in 3 packs"; "" with no packs."""
    if not counted.get("packs"):
        return ""
    if counted["packed"] >= counted["done"]:
        return f", in {counted['packs']} packs"
    return f", {counted['packed']} of them in {counted['packs']} packs"


def _packing_rows(packing: dict[str, Any] | None) -> list[tuple[str, str]]:
    if not packing or packing["pack_size"] == 1:
        return []
    rows = [("packs", f"{packing['pack_size']} devices per task, {packing['pack_mode']}")]
    if packing.get("chosen"):
        rows.append(("packs chosen by auto", packing["chosen"]))
    return rows


ROUND_HEADERS = [
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
# The CSV's columns: the round's numbers as the report has them, unrounded, with when it began and ended
# (the page's columns are the same, in this order, formatted).
CSV_KEYS = ["state", "selected", "done", "failed", "retried", "wall_s"]
CSV_TIMES = [
    "queue_wait_mean_s",
    "load_s",
    "compute_s",
    "upload_s",
    "between_tasks_s",
    "slots_idle_s",
    "aggregation_s",
    "evaluation_s",
]
CSV_TAIL = ["parallel_efficiency", "tasks_per_s", "accuracy", "loss", "train_loss", "sim_time"]
CSV_CLOCK = ["enqueued_at", "aggregated_at"]


def rounds_table(report: dict[str, Any]) -> LongTable:
    """The table of rounds (versions): formatted for the page, unrounded for the CSV."""
    rows = [
        (
            r["round"],
            r["state"],
            r["selected"],
            r["done"],
            r["failed"],
            r["retried"],
            fmt(r["wall_s"]),
            *(fmt(r["time"][key]) for key in CSV_TIMES),
            percent(r["parallel_efficiency"]),
            fmt(r["tasks_per_s"], 1),
            fmt(r["accuracy"], 4),
            fmt(r["loss"], 4),
        )
        for r in report["rounds"]
    ]
    csv_rows = [
        (
            r["round"],
            *(r[key] for key in CSV_KEYS),
            *(r["time"][key] for key in CSV_TIMES),
            *(r.get(key) for key in CSV_TAIL),
            *(r.get(key) for key in CSV_CLOCK),
        )
        for r in report["rounds"]
    ]
    word = _word(report)
    return LongTable(
        stem=f"{word}s",
        word=word,
        headers=[word, *ROUND_HEADERS],
        rows=rows,
        csv_headers=[word, *CSV_KEYS, *CSV_TIMES, *CSV_TAIL, *CSV_CLOCK],
        csv_rows=csv_rows,
        text_columns=(1,),
    )


def _rounds_section(report: dict[str, Any], table: LongTable | None) -> str:
    if table is None:  # a job kind without rounds (LLM batches)
        return ""
    return f"""<h2>{_word(report).capitalize()}s</h2>
{summary_html(table)}
"""


def _curves(report: dict[str, Any]) -> str:
    """The accuracy curves, under the headline: per round (version), and against simulated time where modelled."""
    if not report["rounds"]:
        return ""
    simulated = '<img src="simulated.png" alt="accuracy against simulated time">\n' if report.get("simulated") else ""
    return f"""<h2>Accuracy</h2>
<img src="accuracy.png" alt="accuracy and loss per {_word(report)}">
{simulated}"""


def _simulated(report: dict[str, Any]) -> str:
    simulated = report.get("simulated")
    if not simulated:
        return ""
    rows = [
        ("simulated seconds", fmt(simulated["sim_s"], 1)),
        ("wall seconds", fmt(simulated["wall_s"], 2)),
        ("simulated seconds per wall second", fmt(simulated["sim_per_wall_s"], 1)),
    ]
    buffered = simulated.get("buffered")
    if buffered:
        rows += [
            ("updates folded", buffered["folded"]),
            ("updates dropped as stale", buffered["stale"]),
            ("updates failed", buffered["failed"]),
        ]
    return f"""<h2>Simulated time</h2>
{html_table(["", "value"], rows, (0,))}
<p class="note">Device speeds and delays are modelled from the seed, never slept: workers train back to back
while the run's clock advances by the modelled times (accuracy against simulated time: at the top).</p>
"""
