"""A dataset whose split is natural, not drawn by fedqueue: digits written by 40 simulated writers.

Each writer has a size (a few write a lot, most write little), favourite digits,
and a hand: a shift of the strokes and an ink strength. The loader returns the
writers as partitions, so `num_devices` must be 40; fedqueue checks that.

    dataset = "fedqueue_examples.writers:load"
    num_devices = 40
"""

from __future__ import annotations

import numpy as np
import torch

from fedqueue.fl.ml.plugins import DatasetRequest, LoadedDataset, TensorData

WRITERS = 40


def load(request: DatasetRequest) -> LoadedDataset:
    from sklearn.datasets import load_digits

    digits = load_digits()
    rng = np.random.default_rng(request.seed)
    images = (digits.images / 16.0).astype(np.float32)
    labels = digits.target.astype(np.int64)
    order = rng.permutation(len(labels))
    test_index, train_index = order[:360], order[360:]

    # Writer sizes follow a long tail; each writer prefers a few digits.
    sizes = rng.pareto(1.5, WRITERS) + 1.0
    writer_of = rng.choice(WRITERS, size=len(train_index), p=sizes / sizes.sum())
    preference = rng.dirichlet(np.full(10, 0.5), WRITERS)
    keep = rng.random(len(train_index)) < preference[writer_of, labels[train_index]] * 10
    train_index, writer_of = train_index[keep], writer_of[keep]

    # A writer's hand: strokes shifted by up to one pixel, ink scaled.
    shifts = rng.integers(-1, 2, size=(WRITERS, 2))
    ink = rng.uniform(0.7, 1.3, WRITERS).astype(np.float32)
    train_images = images[train_index].copy()
    for writer in range(WRITERS):
        mine = writer_of == writer
        shifted = np.roll(train_images[mine], tuple(shifts[writer]), axis=(1, 2))
        train_images[mine] = np.clip(shifted * ink[writer], 0.0, 1.0)

    partitions = [np.flatnonzero(writer_of == writer) for writer in range(WRITERS)]
    for writer, part in enumerate(partitions):
        if len(part) == 0:  # every writer wrote at least one digit
            partitions[writer] = np.array([writer % len(train_index)])
    return LoadedDataset(
        train=TensorData(torch.from_numpy(train_images).unsqueeze(1), torch.from_numpy(labels[train_index])),
        test=TensorData(torch.from_numpy(images[test_index]).unsqueeze(1), torch.from_numpy(labels[test_index])),
        num_classes=10,
        partitions=partitions,
    )
