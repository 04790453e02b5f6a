"""FedRevive's pure parts: beta schedules against hand-computed values, the mixed delta, distillation."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

from fedqueue.fl.ml.aggregate import fold_buffer, fold_deltas
from fedqueue.fl.ml.distill import KdData, class_proportions, distil, kd_beta, mixed_delta
from fedqueue.fl.ml.teacher_stack import TeacherStack


@pytest.mark.parametrize(
    ("rule", "factor", "staleness", "expected"),
    [
        (0.5, 75, 0, 0.5),  # a number is a constant beta
        ("cosine", 75, 0, 0.0),
        ("cosine", 75, 75, 0.5),  # 1 - (1 + cos(pi / 2)) / 2
        ("cosine", 75, 150, 1.0),
        ("cosine", 75, 151, 1.0),
        ("cosine", 4, 2, 1 - 0.5 * (1 + math.cos(math.pi / 4))),
        ("exponential", 0.5, 2, 1 - math.exp(-1)),
        ("linear", 0.1, 3, 0.3),
        ("linear", 0.1, 30, 1.0),
        # stepwise: base = factor x concurrency / buffer_size = 1.5 x 100 / 1 = 150; steps at 37.5, 75, 112.5, 150
        ("stepwise", 1.5, 37, 0.0),
        ("stepwise", 1.5, 38, 0.25),
        ("stepwise", 1.5, 100, 0.5),
        ("stepwise", 1.5, 120, 0.75),
        ("stepwise", 1.5, 150, 1.0),
    ],
)
def test_beta_schedules(rule: float | str, factor: float, staleness: int, expected: float) -> None:
    assert kd_beta(rule, factor, staleness, concurrency=100, buffer_size=1) == pytest.approx(expected, abs=1e-12)


def test_mixed_delta_and_fold_by_hand() -> None:
    base = {"w": torch.tensor([1.0, 2.0]), "steps": torch.tensor(3)}
    local = {"w": torch.tensor([3.0, 2.0]), "steps": torch.tensor(4)}
    kd = {"w": torch.tensor([-1.0, 1.0], dtype=torch.float64)}
    mixed = mixed_delta(base, local, kd, 0.25)  # 0.75 x [2, 0] + 0.25 x [-1, 1]
    assert mixed.keys() == {"w"}
    assert torch.equal(mixed["w"], torch.tensor([1.25, 0.25], dtype=torch.float64))
    assert torch.equal(mixed_delta(base, local, kd, 0.0)["w"], torch.tensor([2.0, 0.0], dtype=torch.float64))
    current = {"w": torch.tensor([10.0, 10.0]), "steps": torch.tensor(7)}
    # current + lr x (1.0 x [1.25, 0.25] + 0.5 x [2, 0]) / 2 with lr = 2
    folded = fold_deltas(current, [(1.0, mixed), (0.5, mixed_delta(base, local, None, 0.9))], 2.0)
    assert torch.equal(folded["w"], torch.tensor([12.25, 10.25])) and folded["steps"] == 7
    # FedBuff's own fold of the same plain update agrees.
    plain = fold_buffer(current, [(0.5, base, local)], 1.0)
    assert torch.equal(plain["w"], torch.tensor([11.0, 10.0]))


def test_distillation_moves_the_student_toward_its_teachers() -> None:
    torch.manual_seed(0)
    x = torch.randn(200, 4)
    y = torch.randint(0, 3, (200,))
    teacher = nn.Linear(4, 3)
    student = nn.Linear(4, 3)
    data = KdData(x, y, 3)

    def gap() -> float:
        with torch.no_grad():
            return float(
                torch.nn.functional.kl_div(
                    torch.log_softmax(student(x), 1), torch.softmax(teacher(x), 1), reduction="batchmean"
                )
            )

    before = gap()
    proportions = class_proportions(y.numpy(), 3)
    for version in ("distribution_match_batch", "avg_logits", "avg_loss"):
        distil(
            student,
            TeacherStack([teacher]),
            [proportions],
            data,
            np.random.default_rng(0),
            iters=60,
            lr=0.05,
            batch_size=32,
            temperature=2.0,
            version=version,
        )
    assert gap() < before / 4


def test_distribution_matched_batches_follow_a_device_s_labels() -> None:
    y = torch.tensor([0] * 50 + [1] * 50 + [2] * 50)
    data = KdData(torch.zeros(150, 1), y, 4)  # class 3 has no held-out sample
    picks = data.matching(np.random.default_rng(1), 4000, np.array([0.7, 0.0, 0.2, 0.1]))
    counts = np.bincount(y[picks].numpy(), minlength=4) / 4000
    assert counts == pytest.approx([0.7 / 0.9, 0.0, 0.2 / 0.9, 0.0], abs=0.03)
