"""bench/fedrevive_table.py's arithmetic over seeds (best, final, their spread, the orderings), on hand-made curves."""

from __future__ import annotations

import dataclasses
import json
from types import ModuleType
from typing import Any

import pytest

from tests.support.bench_scripts import load_bench_module


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    return load_bench_module("fedrevive_table")


def run(bench: ModuleType, experiment: str, seed: int, *accuracies: float, schedule: str = "default") -> Any:
    """A run whose evaluations gave these accuracies, one per simulated time unit (a Result of the script's,
    a class mypy cannot see: the script is loaded from its file)."""
    points = [(float(t + 1), accuracy) for t, accuracy in enumerate(accuracies)]
    return bench.Result(experiment, schedule, seed, points, len(points), 1.0, None, {})


def test_final_is_the_last_evaluation_and_best_the_highest(bench: ModuleType) -> None:
    result = run(bench, "fedbuff", 10, 0.30, 0.49, 0.41, 0.30)
    assert (result.final, result.best) == (0.30, 0.49)


def test_a_run_read_back_from_its_raw_line_is_the_same_run(bench: ModuleType) -> None:
    result = run(bench, "fedrevive", 11, 0.5, 0.7)
    assert bench.Result.from_dict(json.loads(json.dumps(dataclasses.asdict(result)))) == result


def test_spread_is_mean_sample_std_and_range_over_seeds(bench: ModuleType) -> None:
    # Seeds in any order: the values come back in seed order.
    results = [
        run(bench, "fedbuff", 12, 0.6, 0.7),
        run(bench, "fedbuff", 10, 0.5, 0.5),
        run(bench, "fedbuff", 11, 0.9, 0.6),
        run(bench, "fedavg", 10, 0.1),
    ]
    final = bench.spread(results, "fedbuff", "default", "final")
    best = bench.spread(results, "fedbuff", "default", "best")
    assert final.values == (0.5, 0.6, 0.7) and best.values == (0.5, 0.9, 0.7)
    assert final.mean == pytest.approx(0.6) and final.std == pytest.approx(0.1)  # n - 1: sqrt(0.02 / 2)
    assert (final.low, final.high) == (0.5, 0.7)
    assert final.text() == "0.600 ± 0.100 (0.500–0.700)"
    assert best.mean == pytest.approx(0.7) and best.std == pytest.approx(0.2)
    assert bench.spread(results, "fedavg", "default", "final").text() == "0.1000"  # one seed: no spread
    assert bench.spread(results, "fedavg", "shifted", "final") is None


def test_an_ordering_counts_seeds_pairwise_and_says_when_the_ranges_overlap(bench: ModuleType) -> None:
    results = [
        # FedRevive beats FedBuff in every seed, though one seed's FedBuff beats another seed's FedRevive.
        run(bench, "fedbuff", 10, 0.50),
        run(bench, "fedbuff", 11, 0.70),
        run(bench, "fedbuff", 12, 0.60),
        run(bench, "fedrevive", 10, 0.55),
        run(bench, "fedrevive", 11, 0.75),
        run(bench, "fedrevive", 12, 0.65),
        # AFL-DW beats FedAvg by far, but not in seed 12; seed 13 has no FedAvg and does not count.
        run(bench, "fedavg", 10, 0.10),
        run(bench, "fedavg", 11, 0.10),
        run(bench, "fedavg", 12, 0.95),
        run(bench, "afl_dw", 10, 0.90),
        run(bench, "afl_dw", 11, 0.90),
        run(bench, "afl_dw", 12, 0.90),
        run(bench, "afl_dw", 13, 0.00),
    ]
    close = bench.compare(results, "default", "fedbuff", "fedrevive", "final")
    assert (close.agreeing, close.seeds, close.within_spread) == (3, 3, True)
    assert close.gap == pytest.approx(0.05)
    assert close.text() == "3/3 seeds, +5.0 points, within the spread"
    mixed = bench.compare(results, "default", "fedavg", "afl_dw", "final")
    assert (mixed.agreeing, mixed.seeds, mixed.within_spread) == (2, 3, True)
    apart = bench.compare(results, "default", "fedavg", "fedbuff", "final")
    assert apart is not None and apart.agreeing == 2
    gone = [run(bench, "fedavg", 10, 0.1), run(bench, "fedbuff", 10, 0.5), run(bench, "fedbuff", 11, 0.6)]
    clear = bench.compare(gone + [run(bench, "fedavg", 11, 0.2)], "default", "fedavg", "fedbuff", "best")
    assert (clear.agreeing, clear.within_spread) == (2, False)
    assert clear.text().endswith("ranges apart")
    assert bench.compare(results, "shifted", "fedavg", "fedbuff", "final") is None

    ranked = bench.ranking(results, "default", ["fedavg", "fedbuff", "fedrevive", "afl_dw"], "final")
    assert [(c.lower, c.higher) for c in ranked] == [
        ("fedavg", "fedbuff"),
        ("fedbuff", "fedrevive"),
        ("fedrevive", "afl_dw"),
    ]

    lines = bench.orderings(results, ["default"], ["fedavg", "fedbuff", "fedrevive", "afl_dw"])
    assert lines[0].startswith("default, final: FedAvg < FedBuff < FedRevive does NOT hold in every seed")
    assert "FedBuff < FedRevive: 3/3 seeds, +5.0 points, within the spread" in lines[0]
    assert lines[1].startswith("default, final, ranked by mean: FedAvg < FedBuff [2/3 seeds")


def test_the_table_gives_best_and_final_with_their_spread(bench: ModuleType) -> None:
    results = [
        run(bench, "fedbuff", 10, 0.4, 0.5, schedule="shifted"),
        run(bench, "fedbuff", 11, 0.9, 0.6, schedule="shifted"),
        run(bench, "fedbuff", 12, 0.6, 0.7, schedule="shifted"),
    ]
    text = bench.table(results, ["fedavg", "fedbuff"], ["default", "shifted"], full=False)
    header, _, row = text.splitlines()
    assert "final: mean ± std (min–max) over 3 seeds" in header and "best: mean ± std (min–max) over 3 seeds" in header
    cells = [cell.strip() for cell in row.strip("|").split("|")]
    assert cells[:6] == [
        "fedbuff",
        "shifted",
        "0.600 ± 0.100 (0.500–0.700)",
        "0.700 ± 0.200 (0.500–0.900)",
        "0.5000 / 0.6000 / 0.7000",
        "0.5000 / 0.9000 / 0.7000",
    ]
    full = bench.table(results, ["fedbuff"], ["shifted"], full=True).splitlines()[-1]
    assert full.endswith("| 0.3019 / 0.4886 | NO |")  # --full: every seed's final against their published one
