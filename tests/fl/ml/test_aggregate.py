from __future__ import annotations

import itertools
import threading
from collections.abc import Mapping, Sequence

import pytest
import torch

from fedqueue.fl.ml.aggregate import LoadedOnUse, fedavg, fold_buffer, fold_deltas


def _state(seed: int, dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    # Magnitudes over many decades make float sums depend on their order.
    scale = 10.0 ** torch.randint(-6, 7, (64, 8), generator=generator)
    return {
        "w": (torch.randn(64, 8, generator=generator, dtype=torch.float64) * scale).to(dtype),
        "b": torch.randn(8, generator=generator).to(dtype),
        "count": torch.tensor(seed, dtype=torch.int64),
    }


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_any_arrival_order_gives_bit_identical_weights() -> None:
    base = _state(0, torch.float64)
    updates = [(device, 10 + 7 * device, _state(device + 1, torch.float64)) for device in range(4)]
    results = [fedavg(base, list(order), 0.7) for order in itertools.permutations(updates)]
    assert all(_same(results[0], result) for result in results[1:])

    # The check has teeth: summing these deltas in another order changes bits.
    deltas = [u[2]["w"] - base["w"] for u in updates]
    forward = deltas[0] + deltas[1] + deltas[2] + deltas[3]
    backward = deltas[3] + deltas[2] + deltas[1] + deltas[0]
    assert not torch.equal(forward, backward)


def test_equal_samples_and_unit_lr_is_the_plain_mean() -> None:
    base = _state(0)
    updates = [(device, 5, _state(device + 1)) for device in range(3)]
    result = fedavg(base, updates, 1.0)
    for key in ("w", "b"):
        mean = torch.stack([u[2][key].double() for u in updates]).mean(0)
        assert torch.allclose(result[key].double(), mean, rtol=1e-6, atol=1e-6)
        assert result[key].dtype == torch.float32


def test_weights_follow_sample_counts() -> None:
    base = {"w": torch.zeros(4)}
    updates = [(0, 1, {"w": torch.full((4,), 4.0)}), (1, 3, {"w": torch.full((4,), 8.0)})]
    assert torch.equal(fedavg(base, updates, 1.0)["w"], torch.full((4,), 7.0))
    assert torch.equal(fedavg(base, updates, 0.5)["w"], torch.full((4,), 3.5))


def test_non_float_buffer_comes_from_the_lowest_device() -> None:
    base = _state(0)
    updates = [(4, 1, _state(40)), (2, 1, _state(20)), (9, 1, _state(90))]
    result = fedavg(base, updates, 1.0)
    assert result["count"].dtype == torch.int64
    assert int(result["count"]) == 20


def test_zero_global_lr_keeps_the_global_weights() -> None:
    base = _state(0)
    result = fedavg(base, [(0, 3, _state(1)), (1, 4, _state(2))], 0.0)
    assert torch.equal(result["w"], base["w"]) and torch.equal(result["b"], base["b"])


def test_inputs_are_left_untouched() -> None:
    base, local = _state(0), _state(1)
    base_copy = {k: v.clone() for k, v in base.items()}
    local_copy = {k: v.clone() for k, v in local.items()}
    result = fedavg(base, [(0, 1, local)], 1.0)
    assert _same(base, base_copy) and _same(local, local_copy)
    result["w"].add_(1.0)
    assert _same(base, base_copy) and _same(local, local_copy)


def test_bad_updates() -> None:
    base = _state(0)
    with pytest.raises(ValueError):
        fedavg(base, [], 1.0)
    with pytest.raises(ValueError):
        fedavg(base, [(1, 2, _state(1)), (1, 3, _state(2))], 1.0)
    with pytest.raises(ValueError):
        fedavg(base, [(1, 2, {"w": base["w"]})], 1.0)


def test_updates_loaded_on_use_are_read_once_each_and_give_the_same_weights() -> None:
    """A round read one update at a time aggregates bit for bit like one held in memory."""
    base = _state(0)
    held = [(device, 5 + device, _state(device + 1)) for device in (6, 2, 9, 4)]
    reads: list[int] = []

    def load(position: int) -> dict[str, torch.Tensor]:
        reads.append(position)
        return held[position][2]

    streamed = LoadedOnUse([(device, samples) for device, samples, _ in held], load)
    assert _same(fedavg(base, streamed, 0.9), fedavg(base, held, 0.9))
    assert sorted(reads) == [0, 1, 2, 3]  # each blob read once
    assert reads == [1, 3, 0, 2]  # in device order: 2, 4, 6, 9
    assert streamed[-1][0] == 4 and [device for device, _, _ in streamed[1:3]] == [2, 9]


def test_reading_ahead_reads_each_update_once_and_passes_on_a_failed_read() -> None:
    """Background reads change nothing in the result; a blob that fails to load fails the aggregation."""
    base = _state(0)
    held = [(device, 3 + device, _state(device + 1)) for device in range(6)]
    reads: list[int] = []
    lock = threading.Lock()

    def load(position: int) -> dict[str, torch.Tensor]:
        with lock:
            reads.append(position)
        if position == broken:
            raise ValueError(f"blob {position} does not match its sha256")
        return held[position][2]

    counts = [(device, samples) for device, samples, _ in held]
    broken = -1
    with LoadedOnUse(counts, load, read_ahead=3) as streamed:
        assert _same(fedavg(base, streamed, 1.0), fedavg(base, held, 1.0))
    assert sorted(reads) == list(range(6))
    broken = 4
    with LoadedOnUse(counts, load, read_ahead=3) as streamed, pytest.raises(ValueError, match="blob 4"):
        fedavg(base, streamed, 1.0)


@pytest.mark.parametrize("read_ahead", [0, 4])
def test_updates_read_in_chunks_are_read_once_each_with_few_calls(read_ahead: int) -> None:
    """Many small updates come in chunks (one round trip each), every update read once, the same weights."""
    base = _state(0)
    held = [(device, 2 + device, _state(device + 1)) for device in range(10)]
    calls: list[list[int]] = []
    lock = threading.Lock()

    def load_many(positions: Sequence[int]) -> list[Mapping[str, torch.Tensor]]:
        chosen = list(positions)
        with lock:
            calls.append(chosen)
        return [held[position][2] for position in chosen]

    def load_one(position: int) -> dict[str, torch.Tensor]:
        raise AssertionError("read one by one although chunks were asked for")

    counts = [(device, samples) for device, samples, _ in held]
    with LoadedOnUse(counts, load_one, read_ahead, load_many=load_many, chunk=4) as streamed:
        assert _same(fedavg(base, streamed, 0.8), fedavg(base, held, 0.8))
    assert sorted(calls) == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]


def test_pre_summed_packs_average_with_devices_alone() -> None:
    """A pack's sum of samples x (local - global) stands for its devices; counters follow the lowest device."""
    base = _state(0, torch.float64)
    updates = [(device, 3 + device, _state(device + 1, torch.float64)) for device in range(5)]

    def pack_sum(members: list[tuple[int, int, dict[str, torch.Tensor]]]) -> tuple[int, int, dict[str, torch.Tensor]]:
        summed = {
            name: sum(
                ((state[name] - base[name]) * samples for _, samples, state in members), torch.zeros_like(base[name])
            )
            for name in ("w", "b")
        }
        return members[0][0], sum(samples for _, samples, _ in members), {**summed, "count": members[0][2]["count"]}

    expected = fedavg(base, updates, 0.7)
    for alone, packs in (([updates[3]], [updates[:3], updates[4:]]), ([], [updates[:2], updates[2:]])):
        result = fedavg(base, alone, 0.7, sums=[pack_sum(pack) for pack in packs])
        assert int(result["count"]) == int(expected["count"]) == 1
        for name in ("w", "b"):
            torch.testing.assert_close(result[name], expected[name], rtol=1e-12, atol=0)
    with pytest.raises(ValueError, match="device 0 alone and in a pre-summed pack"):
        fedavg(base, updates[:1], 0.7, sums=[pack_sum(updates[:2])])


@pytest.mark.parametrize(("threads", "group"), [(1, 1), (2, 1), (3, 2), (4, 2), (1, 16), (2, 16)])
def test_fedavg_split_over_threads_gives_the_bits_of_one_whole_pass(
    threads: int, group: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Tensors of many slices are split between threads, and updates folded a group at a time (each slice takes
    the group's shares in turn); each element's arithmetic, and so its bits, stays that of the plain whole-tensor
    formula, pre-summed packs included."""
    import fedqueue.fl.ml.aggregate as aggregate

    monkeypatch.setattr(aggregate, "AGGREGATION_THREADS", threads)
    size = 5 * aggregate._SLICE + 123  # several slices and a ragged end
    monkeypatch.setattr(aggregate, "FOLD_GROUP_BYTES", group * size * 4)
    assert aggregate.fold_group({"w": torch.zeros(size)}) == group
    generator = torch.Generator().manual_seed(7)

    def state() -> dict[str, torch.Tensor]:
        scale = 10.0 ** torch.randint(-6, 7, (size,), generator=generator)
        return {"w": (torch.randn(size, generator=generator, dtype=torch.float64) * scale).float()}

    base = state()
    updates = [(device, 3 + device, state()) for device in (0, 4, 9)]
    packs = [[(device, 11 + device, state()) for device in range(first, first + 2)] for first in (2, 5, 7)]
    sums = []
    for pack in packs:
        summed = torch.zeros(size, dtype=torch.float64)
        for _, samples, s in pack:
            summed += (s["w"].double() - base["w"].double()) * samples
        sums.append((pack[0][0], sum(samples for _, samples, _ in pack), {"w": summed}))
    total = sum(samples for _, samples, _ in updates) + sum(samples for _, samples, _ in sums)

    result = fedavg(base, updates, 0.7, sums=sums[::-1])

    # Devices alone and packs' sums in one order, by (lowest) device: FedAvg's sum, divided at the step.
    shares = {device: (samples, s["w"].double() - base["w"].double()) for device, samples, s in updates}
    shares.update({device: (1, summed_state["w"]) for device, _, summed_state in sums})
    delta = torch.zeros(size, dtype=torch.float64)
    for device in sorted(shares):
        count, share = shares[device]
        delta.add_(share, alpha=count)
    expected = (delta * (0.7 / total) + base["w"].double()).float()
    assert torch.equal(result["w"].view(torch.int32), expected.view(torch.int32))


def test_a_process_forked_after_a_threaded_fold_gets_aggregation_threads_of_its_own() -> None:
    """A prefork worker's slot is forked from a process that may have folded: its aggregation threads must not be
    the parent's, which the child does not have (work handed to them would wait forever). The child runs no torch
    operation: torch's own thread pool is not fork-safe in a process that used it, as this one has."""
    import multiprocessing

    import fedqueue.fl.ml.aggregate as aggregate

    size = 4 * aggregate._SLICE
    base = {"w": torch.zeros(size)}
    assert torch.equal(fedavg(base, [(0, 1, {"w": torch.ones(size)})], 1.0)["w"], torch.ones(size))  # threads up

    context = multiprocessing.get_context("fork")
    with context.Pool(1) as pool:
        assert pool.apply_async(_threads_answer).get(timeout=60) == "answered"


def _threads_answer() -> str:
    import fedqueue.fl.ml.aggregate as aggregate

    return aggregate._threads().submit(lambda: "answered").result(timeout=30)


@pytest.mark.parametrize(("threads", "group"), [(1, 1), (2, 1), (3, 2), (1, 16), (2, 16)])
def test_buffered_folds_over_threads_and_groups_give_the_bits_of_one_whole_pass(
    threads: int, group: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """FedBuff's fold (each update's change from the version it trained on) and FedRevive's (float64 deltas)
    split between threads and folded a group of updates per slice: each element's bits stay those of the
    whole-tensor formula in arrival order, a group cut short at the end included."""
    import fedqueue.fl.ml.aggregate as aggregate

    monkeypatch.setattr(aggregate, "AGGREGATION_THREADS", threads)
    size = 5 * aggregate._SLICE + 123
    monkeypatch.setattr(aggregate, "FOLD_GROUP_BYTES", group * size * 4)
    generator = torch.Generator().manual_seed(11)

    def state() -> dict[str, torch.Tensor]:
        scale = 10.0 ** torch.randint(-6, 7, (size,), generator=generator)
        return {
            "w": (torch.randn(size, generator=generator, dtype=torch.float64) * scale).float(),
            "n": torch.tensor(4),
        }

    current, older = state(), state()
    buffer = [(0.5 + 0.1 * index, older if index % 2 else current, state()) for index in range(5)]
    total = torch.zeros(size, dtype=torch.float64)
    for weight, base, local in buffer:
        total.add_(local["w"].double() - base["w"].double(), alpha=weight)
    expected = (total * (0.7 / len(buffer)) + current["w"].double()).float()
    folded = fold_buffer(current, iter(buffer), 0.7)
    assert torch.equal(folded["w"].view(torch.int32), expected.view(torch.int32)) and folded["n"] == 4

    deltas = [(weight, {"w": local["w"].double() - base["w"].double()}) for weight, base, local in buffer]
    assert torch.equal(fold_deltas(current, deltas, 0.7)["w"].view(torch.int32), expected.view(torch.int32))
    with pytest.raises(ValueError, match="'w' has 3 elements"):
        fold_buffer(current, [(1.0, current, {"w": torch.zeros(3), "n": torch.tensor(1)})], 1.0)


def test_a_process_folds_into_its_last_folds_sums_zeroed_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """A CPU fold keeps its float64 sums for the next fold of the same shapes (no fresh pages a round); they
    start from zero again, so a fold gives the bits it gives in a fresh process, after a fold of others."""
    import fedqueue.fl.ml.aggregate as aggregate

    monkeypatch.setattr(aggregate, "_KEPT_SUMS", aggregate._KeptSums())  # a fresh process's
    base = _state(0, torch.float64)
    first = [(device, 10, _state(device + 1, torch.float64)) for device in range(3)]
    second = [(device, 5 + device, _state(device + 9, torch.float64)) for device in range(3)]
    fresh = fedavg(base, second, 0.5)
    kept = aggregate._KEPT_SUMS._kept
    assert kept is not None and kept.keys() == {"w", "b"}

    fedavg(base, first, 0.5)
    assert _same(fedavg(base, second, 0.5), fresh)
    assert aggregate._KEPT_SUMS._kept is kept  # the same sums, not new ones
    # FedBuff's fold takes them too, and gives the bits it gives with sums of its own.
    buffer = [(0.5, base, state) for _, _, state in first]
    folded = fold_buffer(base, buffer, 0.7)
    assert aggregate._KEPT_SUMS._kept is kept
    monkeypatch.setattr(aggregate, "_KEPT_SUMS", aggregate._KeptSums())
    assert _same(fold_buffer(base, buffer, 0.7), folded)
    # Other shapes get sums of their own.
    assert _same(fedavg(base, second, 0.5), fresh)
    other = {"w": torch.ones(3, dtype=torch.float64)}
    fedavg(other, [(0, 1, {"w": torch.zeros(3, dtype=torch.float64)})], 1.0)
    assert aggregate._KEPT_SUMS._kept is not None and aggregate._KEPT_SUMS._kept["w"].shape == (3,)
