"""FedRevive's published table, rerun: their five experiments on two delay schedules, each to the same simulated time.

    .venv/bin/python bench/fedrevive_table.py [--reduced] [--seeds 10 11]     # the digits, about 20 min on 2 cores
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

Prints a Markdown table (final and best test accuracy per experiment and schedule, the mean over seeds and
each seed, versions made, wall seconds) and, per schedule and seed, whether FedAvg < FedBuff < FedRevive
holds at the budget; draws accuracy against simulated time, one panel per schedule (PNG).
"""

from __future__ import annotations

import argparse
import copy
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

EXPERIMENTS = ("fedavg", "fedbuff", "fedrevive", "dd_fedrevive", "afl_dw")
LABELS = {
    "fedavg": "FedAvg (sync)",
    "fedbuff": "FedBuff (buffer 2)",
    "fedrevive": "FedRevive (data-free KD)",
    "dd_fedrevive": "FedRevive, data-dependent KD",
    "afl_dw": "AFL-DW (async, cosine down-weight)",
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
    if config.kd_augmentation == "dfkd":
        for key in ("freeze_rounds", "warmup_rounds"):
            if key in config.dfkd:
                milestones[f"{key} {config.dfkd[key]}"] = made_at.get(int(config.dfkd[key]))
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


def table(results: list[Result], experiments: list[str], schedules: list[str], full: bool) -> str:
    headers = [
        "experiment",
        "schedule",
        "final (mean)",
        "final per seed",
        "best (mean)",
        "best per seed",
        "versions per seed",
        "wall s per seed",
    ]
    if full:
        headers += ["published final / best", f"final within {TOLERANCE * 100:.0f} points"]
    rows = []
    for schedule in schedules:
        for experiment in experiments:
            found = [r for r in results if r.experiment == experiment and r.schedule == schedule]
            if not found:
                continue
            finals, bests = [r.final for r in found], [r.best for r in found]
            row = [
                experiment,
                schedule,
                f"{statistics.fmean(finals):.4f}",
                _seeds(finals),
                f"{statistics.fmean(bests):.4f}",
                _seeds(bests),
                " / ".join(str(r.versions) for r in found),
                " / ".join(f"{r.wall_s:.0f}" for r in found),
            ]
            if full:
                published = PUBLISHED.get((experiment, schedule))
                if published is None:
                    row += ["–", "–"]
                else:
                    close = all(abs(final - published[0]) <= TOLERANCE for final in finals)
                    row += [f"{published[0]:.4f} / {published[1]:.4f}", "yes" if close else "NO"]
            rows.append(row)
    return markdown_table(headers, rows)


def ordering(results: list[Result], schedules: list[str], seeds: list[int]) -> list[str]:
    """Per schedule and seed: whether FedAvg < FedBuff < FedRevive holds in final accuracy at the budget."""
    lines = []
    for schedule in schedules:
        for seed in seeds:
            finals = {
                r.experiment: r.final
                for r in results
                if r.schedule == schedule and r.seed == seed and r.experiment in ORDER
            }
            if len(finals) < len(ORDER):
                continue
            chain = " < ".join(f"{LABELS[name].split(' (')[0]} {finals[name]:.4f}" for name in ORDER)
            holds = all(finals[a] < finals[b] for a, b in zip(ORDER, ORDER[1:], strict=False))
            broken = [
                f"{a} {finals[a]:.4f} >= {b} {finals[b]:.4f}"
                for a, b in zip(ORDER, ORDER[1:], strict=False)
                if finals[a] >= finals[b]
            ]
            verdict = "holds" if holds else "FAILS (" + "; ".join(broken) + ")"
            lines.append(f"{schedule}, seed {seed}: {chain}: {verdict}")
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
    parser.add_argument("--seeds", type=int, nargs="+", default=[10, 11], help="10 is their table's")
    parser.add_argument("--experiments", nargs="+", choices=EXPERIMENTS, default=list(EXPERIMENTS))
    parser.add_argument("--schedules", nargs="+", choices=SCHEDULES, default=list(SCHEDULES))
    parser.add_argument("--budget-default", type=float, help="simulated time on the default clock")
    parser.add_argument("--budget-shifted", type=float, help="simulated time on the shifted clock")
    parser.add_argument("--data-root", type=Path, help="--full: the folder holding cifar-10-batches-py/")
    parser.add_argument("--procs", type=int, default=os.cpu_count() or 1, help="worker processes")
    parser.add_argument("--plot", type=Path, help="where the PNG goes (default: bench/fedrevive_table[_full].png)")
    parser.add_argument("--run-timeout", type=float, default=3600.0, help="wall seconds one run may take")
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
    if not args.no_wait:
        wait_for_quiet()
    load = ForeignLoad()
    began = time.monotonic()
    results = run_all(args, configs, budgets, data_root)
    wall = time.monotonic() - began

    shown = configs.relative_to(REPO)
    budget_text = ", ".join(f"{s} {budgets[s]:g}" for s in args.schedules)
    print(
        f"\n{mode}: {shown}/*.toml, seeds {', '.join(map(str, args.seeds))}, simulated-time budget {budget_text};"
        f" {args.procs} worker processes, {wall / 60:.1f} min in all\n"
    )
    print(table(results, args.experiments, args.schedules, args.full))
    print("\nFedAvg < FedBuff < FedRevive in final test accuracy at the budget:")
    for line in ordering(results, args.schedules, args.seeds):
        print(f"- {line}")
    title = "their CIFAR-10 configs" if args.full else "small versions (digits, MLP, 100 devices, 20 at once)"
    draw(plot, results, args.experiments, budgets, title)
    print(f"\nplot: {plot.relative_to(REPO) if plot.resolve().is_relative_to(REPO) else plot.name}")
    print(load.report())


if __name__ == "__main__":
    main()
