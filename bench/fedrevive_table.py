"""FedRevive's published table, rerun: their five experiments on two delay schedules, each to the same simulated time.

    .venv/bin/python bench/fedrevive_table.py [--reduced] [--seeds 10 11 12]  # the digits, 20-50 min on 2 cores
    .venv/bin/python bench/fedrevive_table.py --full --data-root data/cifar10  # their CIFAR-10 configs (a GPU)

Their table (docs/fedrevive-reference.md section 8: seed 10, CIFAR-10) compares FedAvg, FedBuff and
FedRevive at an equal budget of simulated time, on their default clock (200 time units) and on a
"shifted" one (100 units: every device trains Exp(0.1), downloads in 0.02 and uploads in U(0.05 or 0.10
+- 0.01)). Here each of their five experiments (fedavg, fedbuff, fedrevive, dd_fedrevive, afl_dw) runs on
both schedules, for each seed, until its next update would come past the budget: target_accuracy,
early_stop and the bounds on versions are dropped, so simulated time alone ends every run.

--full runs their configs (examples/fedrevive/*.toml: ResNet-18, 1,000 devices, CIFAR-10 read from
--data-root) to 200 and 100 units, and checks each final accuracy against their published one (within 3
points). --reduced (the default) runs the small versions (examples/fedrevive/small/*.toml: the digits, an
MLP, 100 devices, 20 at once) to a tenth of their budgets (20 and 10 units), where FedRevive's freeze and
warm-up (10 and 20 versions) are passed within the first fifth of the budget on the default clock and the
first twentieth on the shifted one (each run prints when).

One seed cannot carry such a table (their simulator and FLARE's port, on identical shards and device speeds,
differ by 5 points on FedBuff's final accuracy; FedBuff on the shifted clock ends at 0.30 after a best of
0.49), so each cell is read over seeds (3 by default: a seed draws the shards, the device speeds, the
initial weights and the batches, and for the digits which 359 are the test set). Prints a Markdown table (per experiment and schedule: final accuracy, the last
evaluation, and best, the highest, each as mean ± sample std (min–max) over seeds and per seed; versions
made; wall seconds) and, per schedule and for final and best alike, their table's FedAvg < FedBuff <
FedRevive and all five ranked by their means, each step with the seeds in which it holds and whether the
gap is within the spread (the two ranges over seeds overlap); draws accuracy against simulated time, one
panel per schedule (PNG: the mean over seeds, a band from the lowest seed to the highest). --raw FILE keeps
each run's curve as it ends; --from-raw FILE draws the table and plot again from one without running.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import os
import statistics
import sys
import tempfile
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import REPO, ForeignLoad, machine, machine_line, markdown_table, wait_for_quiet, wait_run  # noqa: E402

from fedqueue.config import Settings  # noqa: E402
from fedqueue.fl.config import RunConfig  # noqa: E402
from fedqueue.fl.store.results import list_rounds  # noqa: E402
from fedqueue.fl.strategy.fedrevive.section import FedReviveSection

EXPERIMENTS = ("fedavg", "fedbuff", "fedrevive", "dd_fedrevive", "afl_dw")
LABELS = {
    "fedavg": "FedAvg (sync)",
    "fedbuff": "FedBuff (buffer 2)",
    "fedrevive": "FedRevive (data-free KD)",
    "dd_fedrevive": "FedRevive, data-dependent KD",
    "afl_dw": "AFL-DW (async, cosine down-weight)",
}
SHORT = {
    "fedavg": "FedAvg",
    "fedbuff": "FedBuff",
    "fedrevive": "FedRevive",
    "dd_fedrevive": "DD-FedRevive",
    "afl_dw": "AFL-DW",
}
# The ordering their table shows at an equal budget of simulated time.
ORDER = ("fedavg", "fedbuff", "fedrevive")
SCHEDULES = ("default", "shifted")

# Their default clock is the one every example file writes out (a trip: 0.1 + Exp(1 | 1.3 | 1.6) + U(0.15 |
# 0.25 +- 0.02)). The shifted one: every device trains Exp(0.1), downloads in 0.02, uploads in U(0.05 | 0.10
# +- 0.01), one half each.
SHIFTED_DELAYS: dict[str, dict[str, Any]] = {
    "download_delay": {"type": "constant", "mean_distribution": [[1, 0.02]], "std": 0.0},
    "localtrain_delay": {"type": "exponential", "mean_distribution": [[1, 0.1]], "std": 0.0},
    "upload_delay": {"type": "uniform", "mean_distribution": [[0.5, 0.05], [0.5, 0.10]], "std": 0.01},
}

# Simulated time per schedule. Full: their table's. Reduced: a tenth of theirs. 20 devices at once make about
# 10 versions per unit on the default clock and 100 on the shifted one (theirs: 62 and 513), so FedRevive makes
# about 200 and 1,000 versions, and its warm-up of 20 versions ends near 3.5 and 0.4 units.
BUDGETS = {"full": {"default": 200.0, "shifted": 100.0}, "reduced": {"default": 20.0, "shifted": 10.0}}

# Their published numbers (seed 10, CIFAR-10): final and best test accuracy.
PUBLISHED: dict[tuple[str, str], tuple[float, float]] = {
    ("fedavg", "default"): (0.4022, 0.4056),
    ("fedbuff", "default"): (0.6111, 0.6659),
    ("fedrevive", "default"): (0.7612, 0.7712),
    ("fedbuff", "shifted"): (0.3019, 0.4886),
    ("fedrevive", "shifted"): (0.7917, 0.8325),
}
TOLERANCE = 0.03  # --full: each final accuracy within 3 points of theirs


@dataclass
class Result:
    experiment: str
    schedule: str
    seed: int
    points: list[tuple[float, float]]  # (simulated time, accuracy) of each evaluated version
    versions: int
    wall_s: float
    stop: str | None
    # FedRevive: the simulated time at which its freeze (KD from then on) and warm-up (KD trains) counts were passed.
    milestones: dict[str, float | None]

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> Result:
        raw = dict(raw)
        raw["points"] = [(float(t), float(a)) for t, a in raw["points"]]
        return cls(**raw)

    @property
    def final(self) -> float:
        return self.points[-1][1] if self.points else float("nan")

    @property
    def best(self) -> float:
        return max((accuracy for _, accuracy in self.points), default=float("nan"))


def experiment_config(path: Path, schedule: str, seed: int, budget: float, data_root: Path | None) -> RunConfig:
    """An example file as a run to the budget: its stop rules on accuracy and its bounds on versions dropped."""
    with path.open("rb") as handle:
        raw: dict[str, Any] = tomllib.load(handle)
    for key in ("target_accuracy", "early_stop", "max_rounds", "max_model_version"):
        raw.pop(key, None)
    raw["seed"] = seed
    raw["max_sim_time"] = budget
    raw["name"] = f"{raw.get('name', path.stem)}-{schedule}-seed{seed}"
    raw["rounds"] = 1_000_000  # a bound on rounds (or versions) never reached: the budget ends the run
    if schedule == "shifted":
        raw.update(copy.deepcopy(SHIFTED_DELAYS))
    if data_root is not None:
        raw["data_root"] = str(data_root)
    return RunConfig.from_dict(raw)


def curve(handle: Any, config: RunConfig) -> tuple[list[tuple[float, float]], int, dict[str, float | None]]:
    """(simulated time, accuracy) of each evaluated version, the versions made, and FedRevive's milestones."""
    rows = list_rounds(handle.store, handle.id)
    points = [(row.sim_time, row.accuracy) for row in rows if row.accuracy is not None and row.sim_time is not None]
    versions = sum(1 for row in rows if row.state == "done")
    made_at = {row.round_index: row.sim_time for row in rows if row.state == "done"}
    milestones: dict[str, float | None] = {}
    settings = config.strategy(FedReviveSection)
    if settings.kd_augmentation == "dfkd":
        for key in ("freeze_rounds", "warmup_rounds"):
            if key in settings.dfkd:
                milestones[f"{key} {settings.dfkd[key]}"] = made_at.get(int(settings.dfkd[key]))
    return points, versions, milestones


def run_all(args: argparse.Namespace, configs: Path, budgets: dict[str, float], data_root: Path | None) -> list[Result]:
    import fedqueue

    results: list[Result] = []
    with tempfile.TemporaryDirectory(prefix="fedqueue-bench-") as tmp:
        # The local cluster keeps its workers' logs in a temporary folder of its own: this one, removed at the end.
        saved_tempdir = tempfile.tempdir
        tempfile.tempdir = tmp
        try:
            settings = Settings(
                database_url=f"sqlite:///{Path(tmp) / 'fedrevive_table.db'}", key_prefix="bench-fedrevive-table"
            )
            with fedqueue.local_cluster(procs=args.procs, settings=settings) as cluster:
                for seed in args.seeds:
                    for schedule in args.schedules:
                        for experiment in args.experiments:
                            config = experiment_config(
                                configs / f"{experiment}.toml", schedule, seed, budgets[schedule], data_root
                            )
                            began = time.monotonic()
                            handle = fedqueue.submit(config, settings=cluster.settings)
                            status = wait_run(handle, cluster, timeout_s=args.run_timeout)
                            if status["state"] != "finished":
                                raise RuntimeError(
                                    f"{experiment} {schedule} seed {seed} ended {status['state']}: {status.get('error')}"
                                )
                            points, versions, milestones = curve(handle, config)
                            result = Result(
                                experiment,
                                schedule,
                                seed,
                                points,
                                versions,
                                time.monotonic() - began,
                                status.get("stop"),
                                milestones,
                            )
                            results.append(result)
                            if args.raw is not None:
                                # One line per run as it ends: a table can be drawn again, or a broken rerun kept.
                                with args.raw.open("a") as raw:
                                    raw.write(json.dumps(dataclasses.asdict(result)) + "\n")
                            print(
                                f"{experiment:>12} {schedule:>7} seed {seed}: {versions} versions by"
                                f" {points[-1][0] if points else 0:.2f}, final {result.final:.4f},"
                                f" best {result.best:.4f}, {result.wall_s:.0f} s wall"
                                + "".join(
                                    f"; past {name} at {'never' if at is None else f'{at:.2f}'}"
                                    for name, at in milestones.items()
                                ),
                                flush=True,
                            )
        finally:
            tempfile.tempdir = saved_tempdir
    return results


def _seeds(values: list[float], digits: int = 4) -> str:
    return " / ".join(f"{value:.{digits}f}" for value in values)


@dataclass(frozen=True)
class Spread:
    """One accuracy (final or best) of one experiment on one schedule, over seeds."""

    values: tuple[float, ...]  # one per seed, in the order the seeds ran

    @property
    def mean(self) -> float:
        return statistics.fmean(self.values)

    @property
    def std(self) -> float:
        # The sample standard deviation (n - 1): the seeds are a sample of the shards and speeds one could draw.
        return statistics.stdev(self.values) if len(self.values) > 1 else 0.0

    @property
    def low(self) -> float:
        return min(self.values)

    @property
    def high(self) -> float:
        return max(self.values)

    def text(self) -> str:
        if len(self.values) == 1:
            return f"{self.values[0]:.4f}"
        return f"{self.mean:.3f} ± {self.std:.3f} ({self.low:.3f}–{self.high:.3f})"


def _found(results: list[Result], experiment: str, schedule: str) -> list[Result]:
    return sorted((r for r in results if r.experiment == experiment and r.schedule == schedule), key=lambda r: r.seed)


def spread(results: list[Result], experiment: str, schedule: str, metric: str) -> Spread | None:
    """`metric` ("final": the last evaluation, "best": the highest) over the seeds that ran; None if none did."""
    found = _found(results, experiment, schedule)
    return Spread(tuple(getattr(r, metric) for r in found)) if found else None


@dataclass(frozen=True)
class Comparison:
    """Whether `lower` < `higher` in one metric on one schedule, seed by seed and as spreads."""

    lower: str
    higher: str
    agreeing: int  # seeds in which lower's accuracy is strictly below higher's (the same seed: the same shards)
    seeds: int  # seeds both ran
    gap: float  # higher's mean minus lower's
    within_spread: bool  # their ranges over seeds overlap: the means alone do not separate them

    def text(self) -> str:
        text = f"{self.agreeing}/{self.seeds} seeds, {self.gap * 100:+.1f} points"
        if self.seeds == 1:
            return text  # one seed has no spread to be within
        return text + (", within the spread" if self.within_spread else ", ranges apart")


def compare(results: list[Result], schedule: str, lower: str, higher: str, metric: str) -> Comparison | None:
    a = {r.seed: getattr(r, metric) for r in _found(results, lower, schedule)}
    b = {r.seed: getattr(r, metric) for r in _found(results, higher, schedule)}
    seeds = sorted(a.keys() & b.keys())
    if not seeds:
        return None
    low, high = Spread(tuple(a[s] for s in seeds)), Spread(tuple(b[s] for s in seeds))
    return Comparison(
        lower,
        higher,
        agreeing=sum(1 for s in seeds if a[s] < b[s]),
        seeds=len(seeds),
        gap=high.mean - low.mean,
        within_spread=high.low <= low.high,
    )


def ranking(results: list[Result], schedule: str, experiments: list[str], metric: str) -> list[Comparison]:
    """The experiments from lowest to highest mean, each step as a Comparison of neighbours."""
    means = {e: found.mean for e in experiments if (found := spread(results, e, schedule, metric)) is not None}
    ranked = sorted(means, key=means.__getitem__)  # ties keep the experiments' order
    steps = (compare(results, schedule, a, b, metric) for a, b in zip(ranked, ranked[1:], strict=False))
    return [c for c in steps if c is not None]


def table(results: list[Result], experiments: list[str], schedules: list[str], full: bool) -> str:
    seeds = sorted({r.seed for r in results})
    over = f"mean ± std (min–max) over {len(seeds)} seeds" if len(seeds) > 1 else "one seed"
    headers = [
        "experiment",
        "schedule",
        f"final: {over}",
        f"best: {over}",
        "final per seed",
        "best per seed",
        "versions per seed",
        "wall s per seed",
    ]
    if full:
        headers += ["published final / best", f"final within {TOLERANCE * 100:.0f} points"]
    rows = []
    for schedule in schedules:
        for experiment in experiments:
            found = _found(results, experiment, schedule)
            final, best = spread(results, experiment, schedule, "final"), spread(results, experiment, schedule, "best")
            if final is None or best is None:
                continue
            row = [
                experiment,
                schedule,
                final.text(),
                best.text(),
                _seeds(list(final.values)),
                _seeds(list(best.values)),
                " / ".join(str(r.versions) for r in found),
                " / ".join(f"{r.wall_s:.0f}" for r in found),
            ]
            if full:
                published = PUBLISHED.get((experiment, schedule))
                if published is None:
                    row += ["–", "–"]
                else:
                    close = all(abs(value - published[0]) <= TOLERANCE for value in final.values)
                    row += [f"{published[0]:.4f} / {published[1]:.4f}", "yes" if close else "NO"]
            rows.append(row)
    return markdown_table(headers, rows)


def orderings(results: list[Result], schedules: list[str], experiments: list[str]) -> list[str]:
    """Per schedule and metric: their table's FedAvg < FedBuff < FedRevive, then all five ranked by their means.

    Each step says in how many seeds it holds, the gap between the means, and whether it is within the spread.
    """
    lines = []
    for schedule in schedules:
        for metric in ("final", "best"):
            steps = [compare(results, schedule, a, b, metric) for a, b in zip(ORDER, ORDER[1:], strict=False)]
            if all(step is not None for step in steps):
                held = all(step.agreeing == step.seeds for step in steps if step is not None)
                chain = " < ".join(SHORT[name] for name in ORDER)
                detail = "; ".join(f"{SHORT[s.lower]} < {SHORT[s.higher]}: {s.text()}" for s in steps if s is not None)
                verdict = "holds in every seed" if held else "does NOT hold in every seed"
                lines.append(f"{schedule}, {metric}: {chain} {verdict} ({detail})")
            ranked = ranking(results, schedule, experiments, metric)
            if ranked:
                chain = SHORT[ranked[0].lower] + "".join(f" < {SHORT[c.higher]} [{c.text()}]" for c in ranked)
                lines.append(f"{schedule}, {metric}, ranked by mean: {chain}")
    return lines


def _step(points: list[tuple[float, float]], grid: list[float]) -> list[float]:
    """The latest evaluated accuracy at each grid time (NaN before the first evaluation)."""
    values, index, last = [], 0, float("nan")
    for t in grid:
        while index < len(points) and points[index][0] <= t:
            last = points[index][1]
            index += 1
        values.append(last)
    return values


def draw(path: Path, results: list[Result], experiments: list[str], budgets: dict[str, float], title: str) -> None:
    import numpy as np
    from matplotlib.figure import Figure

    schedules = [s for s in SCHEDULES if any(r.schedule == s for r in results)]
    figure = Figure(figsize=(5.2 * len(schedules), 4.2), dpi=110, layout="constrained")
    axes = figure.subplots(1, len(schedules), squeeze=False)[0]
    for ax, schedule in zip(axes, schedules, strict=True):
        grid = list(np.linspace(0.0, budgets[schedule], 400))
        for experiment in experiments:
            found = [r for r in results if r.experiment == experiment and r.schedule == schedule]
            if not found:
                continue
            # NaN until every seed has an evaluation: the mean and the band start together.
            stacked = np.array([_step(r.points, grid) for r in found])
            color = f"C{EXPERIMENTS.index(experiment)}"  # one color per experiment in every panel
            ax.plot(grid, stacked.mean(axis=0), color=color, label=LABELS[experiment], linewidth=1.6)
            if len(found) > 1:
                low, high = stacked.min(axis=0), stacked.max(axis=0)
                ax.fill_between(grid, low, high, color=color, alpha=0.18, linewidth=0)
        seeds = sorted({r.seed for r in results})
        ax.set_title(
            f"{schedule} schedule, budget {budgets[schedule]:g}; seed{'s' if len(seeds) > 1 else ''}"
            f" {', '.join(map(str, seeds))}",
            loc="left",
            fontsize=9,
        )
        ax.set_xlabel("simulated time")
        ax.set_ylabel("test accuracy")
        ax.set_xlim(0, budgets[schedule])
        ax.grid(color="0.9")
    handles, labels = axes[0].get_legend_handles_labels()
    figure.legend(handles, labels, loc="outside lower center", ncols=3, fontsize=8, frameon=False)
    figure.suptitle(title + " (line: mean over seeds; band: lowest to highest seed)", fontsize=9)
    figure.savefig(path)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    scale = parser.add_mutually_exclusive_group()
    scale.add_argument("--reduced", dest="full", action="store_false", help="the small versions (default)")
    scale.add_argument("--full", dest="full", action="store_true", help="their CIFAR-10 configs (a GPU, CIFAR-10)")
    parser.set_defaults(full=False)
    parser.add_argument("--seeds", type=int, nargs="+", default=[10, 11, 12], help="10 is their table's")
    parser.add_argument("--experiments", nargs="+", choices=EXPERIMENTS, default=list(EXPERIMENTS))
    parser.add_argument("--schedules", nargs="+", choices=SCHEDULES, default=list(SCHEDULES))
    parser.add_argument("--budget-default", type=float, help="simulated time on the default clock")
    parser.add_argument("--budget-shifted", type=float, help="simulated time on the shifted clock")
    parser.add_argument("--data-root", type=Path, help="--full: the folder holding cifar-10-batches-py/")
    parser.add_argument("--procs", type=int, default=os.cpu_count() or 1, help="worker processes")
    parser.add_argument("--plot", type=Path, help="where the PNG goes (default: bench/fedrevive_table[_full].png)")
    parser.add_argument("--run-timeout", type=float, default=3600.0, help="wall seconds one run may take")
    parser.add_argument("--raw", type=Path, help="append each run's curve here (JSON lines) as it ends")
    parser.add_argument("--from-raw", type=Path, help="run nothing: draw the table and plot from --raw's file")
    parser.add_argument("--no-wait", action="store_true", help="start without waiting for the machine to be idle")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    mode = "full" if args.full else "reduced"
    configs = REPO / "examples" / "fedrevive" if args.full else REPO / "examples" / "fedrevive" / "small"
    data_root: Path | None = None
    if args.full:
        with (configs / "fedavg.toml").open("rb") as handle:
            data_root = (args.data_root or Path(tomllib.load(handle)["data_root"])).resolve()
        if not (data_root / "cifar-10-batches-py").is_dir():
            sys.exit(
                f"--full needs CIFAR-10: no cifar-10-batches-py/ in {data_root} (name the folder with --data-root)"
            )
    budgets = dict(BUDGETS[mode])
    if args.budget_default is not None:
        budgets["default"] = args.budget_default
    if args.budget_shifted is not None:
        budgets["shifted"] = args.budget_shifted
    plot = args.plot or REPO / "bench" / ("fedrevive_table_full.png" if args.full else "fedrevive_table.png")

    print(machine_line(machine()))
    load: ForeignLoad | None = None
    if args.from_raw is not None:
        results = [Result.from_dict(json.loads(line)) for line in args.from_raw.read_text().splitlines() if line]
        wall = sum(r.wall_s for r in results)  # the runs' own, without the cluster's start
    else:
        if not args.no_wait:
            wait_for_quiet()
        load = ForeignLoad()
        began = time.monotonic()
        results = run_all(args, configs, budgets, data_root)
        wall = time.monotonic() - began

    # What ran (a --raw file may hold fewer seeds or schedules than asked for, if its run was cut short).
    seeds = sorted({r.seed for r in results})
    schedules = [s for s in args.schedules if any(r.schedule == s for r in results)]
    shown = configs.relative_to(REPO)
    budget_text = ", ".join(f"{s} {budgets[s]:g}" for s in schedules)
    print(
        f"\n{mode}: {shown}/*.toml, seeds {', '.join(map(str, seeds))}, simulated-time budget {budget_text};"
        f" {args.procs} worker processes, {wall / 60:.1f} min in all\n"
    )
    print(table(results, args.experiments, schedules, args.full))
    print(
        "\nOrderings at the budget (final: the last evaluation; best: the highest). Each step: the seeds in which"
        " it holds, the gap between the means, and whether the ranges over seeds overlap (within the spread):"
    )
    for line in orderings(results, schedules, args.experiments):
        print(f"- {line}")
    title = "their CIFAR-10 configs" if args.full else "small versions (digits, MLP, 100 devices, 20 at once)"
    draw(plot, results, args.experiments, budgets, title)
    print(f"\nplot: {plot.relative_to(REPO) if plot.resolve().is_relative_to(REPO) else plot.name}")
    if load is not None:
        print(load.report())


if __name__ == "__main__":
    main()
