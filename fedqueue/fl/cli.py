"""FL's commands, `fedqueue run CONFIG` and `fedqueue submit CONFIG`, and how an FL run is shown."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from fedqueue.cli.common import (
    AllRowsOpt,
    PluginPathOpt,
    ProcsOpt,
    SlotsOpt,
    console,
    error_console,
    friendly_errors,
)
from fedqueue.cli.launch import exit_unless_finished, say_where_results_are, submit_and_follow, submit_detached
from fedqueue.cli.tensorboard import tensorboard_line
from fedqueue.config import DEFAULT_WORKER_SLOTS, Settings
from fedqueue.errors import FedqueueError
from fedqueue.fl.api import RunSubmission, check_tensorboard_dir
from fedqueue.fl.config import LoadedConfig, RunConfig, parse_override, read_run_config
from fedqueue.fl.config_files.explain import marked_toml, missing_data_line, stop_lines
from fedqueue.fl.strategy.registry import strategy_for
from fedqueue.fl.view.tensorboard import run_folder
from fedqueue.report.summary import run_summary
from fedqueue.store import Store

app = typer.Typer(no_args_is_help=True, pretty_exceptions_enable=False)
# A run's table of rounds (versions) keeps its first and last this many rows, when that leaves out at least
# FOLD_MIN_LEFT_OUT: a 200-round run's status fits a screen, the demo's 10 rounds are shown whole.
FOLD_KEPT = 5
FOLD_MIN_LEFT_OUT = 3
STALENESS_SHOWN = 12  # staleness values listed one by one in `status`; more are summed up

ConfigArg = Annotated[
    Path, typer.Argument(help="Run config (TOML, or FedRevive's JSON); see examples/.", show_default=False)
]


def _sets_have_values(items: list[str] | None) -> list[str] | None:
    """`--set rounds 3` read as `--set rounds` and a stray `3`: said here, in one line, before click's own
    "unexpected extra argument" (which names neither --set nor what it expects)."""
    for item in items or []:
        try:
            parse_override(item)
        except FedqueueError as err:
            error_console.print(f"[red]error:[/red] {escape(str(err))}", highlight=False)
            raise typer.Exit(err.exit_code) from None
    return items


SetOpt = Annotated[
    list[str] | None,
    typer.Option("--set", "-s", help="Override a config key: KEY=VALUE (repeatable).", callback=_sets_have_values),
]
RoundsOpt = Annotated[int | None, typer.Option(help="Override `rounds`.")]
SeedOpt = Annotated[int | None, typer.Option(help="Override `seed`.")]
TensorBoardOpt = Annotated[
    Path | None,
    typer.Option(
        "--tensorboard",
        help="Set `tensorboard_dir`: TensorBoard event files of the run under DIR/RUN_ID, written by the process"
        " that follows it (run, resume) as each round or version is made.",
        metavar="DIR",
    ),
]


def _config(
    path: Path, sets: list[str] | None, rounds: int | None, seed: int | None, tensorboard: Path | None = None
) -> RunConfig:
    return _loaded(path, sets, rounds, seed, tensorboard).config


def _loaded(
    path: Path,
    sets: list[str] | None,
    rounds: int | None,
    seed: int | None,
    tensorboard: Path | None = None,
    check_data: bool = True,
) -> LoadedConfig:
    overrides: dict[str, Any] = dict(parse_override(item) for item in sets or [])
    if rounds is not None:
        overrides["rounds"] = rounds
    if seed is not None:
        overrides["seed"] = seed
    if tensorboard is not None:
        overrides["tensorboard_dir"] = str(tensorboard)
    loaded = read_run_config(path, overrides, check_data=check_data)
    for note in loaded.notes:
        error_console.print(f"note: {escape(note)}", highlight=False)
    return loaded


def _announce(run_id: str, run_config: RunConfig) -> None:
    shape = strategy_for(run_config).describe(run_config)
    if run_config.max_sim_time is not None:
        shape += f", until simulated time {run_config.max_sim_time:g}"
    console.print(f"run [bold]{escape(run_id)}[/bold] submitted ({shape})", highlight=False)
    if run_config.tensorboard_dir is not None:  # resolved at submit: the folder this command writes into
        root = Path(run_config.tensorboard_dir)
        console.print(Text(tensorboard_line(run_folder(root, run_id), root)), soft_wrap=True)


def _print_stop(out: Console, summary: dict[str, Any]) -> None:
    """The rule that ended the run; while it runs, the simulated time it has left under max_sim_time."""
    if summary.get("stop"):
        out.print(escape(summary["stop"]), highlight=False)
        return
    budget = summary.get("sim_budget")
    if budget is not None and summary["state"] == "running":
        out.print(
            f"simulated time {budget['used']:.1f} of max_sim_time {budget['max']:g} used, {budget['left']:.1f} left",
            highlight=False,
        )


@app.command()
@friendly_errors
def run(
    config: ConfigArg,
    set_: SetOpt = None,
    rounds: RoundsOpt = None,
    seed: SeedOpt = None,
    procs: ProcsOpt = None,
    slots: SlotsOpt = DEFAULT_WORKER_SLOTS,
    plugin_path: PluginPathOpt = None,
    tensorboard: TensorBoardOpt = None,
    all_rows: AllRowsOpt = False,
) -> None:
    """Submit a run and follow it to the end. With no broker configured, start Redis and workers here. A broker
    that goes while it submits or follows is waited for: one line when it goes, one when it is back, exit 2 past
    FEDQUEUE_BROKER_WAIT_S (the run goes on with `fedqueue resume RUN`)."""
    run_config = _config(config, set_, rounds, seed, tensorboard)
    check_tensorboard_dir(run_config)  # before any worker starts
    submission = RunSubmission(run_config, announce=_announce, apart=True)  # follows with no torch loaded
    settings = Settings.from_env().with_plugin_path(plugin_path)
    handle = submit_and_follow(submission, settings, procs=procs, slots=slots, all_rows=all_rows)
    say_where_results_are(handle)
    exit_unless_finished(handle)


@app.command()
@friendly_errors
def check(config: ConfigArg, set_: SetOpt = None) -> None:
    """Print a config (TOML, or FedRevive's JSON as it is) resolved to fedqueue's knobs, as TOML `run` reads back,
    each key the file or --set gave marked; then the keys that stop the run early, and a dataset folder not there
    yet (shown anyway: a config can be checked before its data is copied)."""
    loaded = _loaded(config, set_, None, None, check_data=False)
    print(marked_toml(loaded).rstrip("\n"))
    for line in stop_lines(loaded.config, loaded.fedrevive_json):
        error_console.print(escape(line), highlight=False)
    missing = missing_data_line(loaded.config)
    if missing is not None:
        error_console.print(f"[yellow]{escape(missing)}[/yellow]", highlight=False)


@app.command()
@friendly_errors
def submit(
    config: ConfigArg,
    set_: SetOpt = None,
    rounds: RoundsOpt = None,
    seed: SeedOpt = None,
    plugin_path: PluginPathOpt = None,
    tensorboard: TensorBoardOpt = None,
) -> None:
    """Enqueue a run on the configured broker, print its id and return."""
    submission = RunSubmission(_config(config, set_, rounds, seed, tensorboard), apart=True)
    print(submit_detached(submission, Settings.from_env().with_plugin_path(plugin_path)))


def show_status(store: Store, run_id: str, as_json: bool, all_rows: bool = False) -> None:
    """What `fedqueue status` prints for an FL run."""
    summary = run_summary(store, run_id)
    if as_json:
        print(json.dumps(summary, indent=2))
    else:
        print_summary(console, summary, all_rows)


def print_summary(out: Console, summary: dict[str, Any], all_rows: bool = False) -> None:
    """The run's rounds (versions) as a table, folded to its first and last rows unless `all_rows`; then its
    updates, times, stop rule, failures and accuracy."""
    buffered = summary.get("buffered")
    # Simulated time is shown where the run models it: async runs, and sync runs given device speeds.
    simulated = buffered is not None or summary.get("simulated_speeds", False)
    word = "version" if buffered else "round"
    table = Table(title=escape(f"run {summary['id']} ({summary['state']})"))
    table.add_column(word, justify="right")
    table.add_column("seconds", justify="right")
    if simulated:
        table.add_column("sim s", justify="right")
    table.add_column("accuracy", justify="right")
    table.add_column("loss", justify="right")
    head, left_out, tail = fold(list(summary["round_seconds"]), all_rows)
    for index in head:
        table.add_row(*_round_cells(summary, index, simulated))
    if left_out:
        table.add_row(f"… {len(left_out)} …", *[""] * (len(table.columns) - 1), style="dim")
    for index in tail:
        table.add_row(*_round_cells(summary, index, simulated))
    out.print(table)
    if left_out:
        out.print(
            f"{len(left_out)} {word}s ({left_out[0]}–{left_out[-1]}) left out:"
            f" fedqueue status {escape(summary['id'])} --all shows every one",
            highlight=False,
        )
    if buffered:
        out.print(
            f"updates: {buffered['folded']} folded, {buffered['stale']} dropped as stale,"
            f" {buffered['failed']} failed (buffer_size {buffered['buffer_size']})"
            f" · staleness {staleness_text(buffered['staleness'])}",
            highlight=False,
        )
    sim_end = max(summary["sim_time"].values(), default=None) if simulated else None
    out.print(
        ("" if sim_end is None else f"simulated {sim_end:.1f} s · ")
        + f"wall {summary['wall_s']:.2f} s · {summary['tasks_done']} device tasks"
        f" ({summary['tasks_failed']} failed) · mean train {summary['mean_train_ms']} ms"
        f" · max_concurrency {summary['max_concurrency']} · {len(summary['workers'])} workers"
    )
    _print_stop(out, summary)
    if summary["error"]:
        out.print(f"[red]run {summary['state']}:[/red] {escape(summary['error'])}", highlight=False)
    for failure in summary["failures"][:5]:
        last_line = (failure["error"] or "").strip().splitlines()[-1:] or ["?"]
        # A buffered run's round r is the devices sent off with version r - 1.
        where = f"training on version {failure['round'] - 1}" if buffered else f"in round {failure['round']}"
        out.print(
            f"[yellow]device {failure['device']} failed[/yellow] {where}"
            f" on {escape(str(failure['worker']))} after {failure['attempts']} attempts: {escape(last_line[0])}",
            highlight=False,
        )
    if len(summary["failures"]) > 5:
        out.print(f"... {len(summary['failures']) - 5} more failed devices (fedqueue status RUN --json)")
    _print_accuracy(out, summary, word)


def staleness_text(histogram: dict[str, int]) -> str:
    """Updates by staleness, "0: 12, 1: 30"; past STALENESS_SHOWN values (a long run with many in flight has
    hundreds) their mean, median and range, on one line (every value: --json)."""
    if len(histogram) <= STALENESS_SHOWN:
        return ", ".join(f"{s}: {n}" for s, n in histogram.items()) or "none"
    counts = sorted((int(s), n) for s, n in histogram.items())
    total = sum(n for _, n in counts)
    mean = sum(s * n for s, n in counts) / total
    seen, median = 0, counts[-1][0]
    for s, n in counts:
        seen += n
        if 2 * seen >= total:
            median = s
            break
    return f"mean {mean:.1f}, median {median}, {counts[0][0]}–{counts[-1][0]} over {total} updates (each: --json)"


def fold(rows: list[str], all_rows: bool) -> tuple[list[str], list[str], list[str]]:
    """A long table's first and last FOLD_KEPT rows, and those between them left out; every row with `all_rows`
    or when leaving some out would save little."""
    if all_rows or len(rows) <= 2 * FOLD_KEPT + FOLD_MIN_LEFT_OUT - 1:
        return rows, [], []
    return rows[:FOLD_KEPT], rows[FOLD_KEPT:-FOLD_KEPT], rows[-FOLD_KEPT:]


def _round_cells(summary: dict[str, Any], index: str, simulated: bool) -> list[str]:
    accuracy = summary["accuracy"].get(index)
    loss = summary["loss"].get(index)
    sim = summary["sim_time"].get(index)
    cells = [index, f"{summary['round_seconds'][index]:.2f}"]
    if simulated:
        cells.append("" if sim is None else f"{sim:.1f}")
    cells += ["" if accuracy is None else f"{accuracy:.4f}", "" if loss is None else f"{loss:.4f}"]
    return cells


def _print_accuracy(out: Console, summary: dict[str, Any], word: str) -> None:
    """The last accuracy: final once the run ended, "so far" (naming its round or version) while it runs."""
    if summary["final_accuracy"] is None:
        return
    if summary["state"] != "running":
        out.print(f"final accuracy {summary['final_accuracy']:.4f}")
        return
    last = max(int(index) for index, value in summary["accuracy"].items() if value is not None)
    out.print(f"accuracy so far {summary['final_accuracy']:.4f} ({word} {last})", highlight=False)
