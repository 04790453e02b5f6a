"""A vmapped pack's pre-summed update, taken a slice at a time: the bits of the whole-tensor sum."""

from __future__ import annotations

import torch

from fedqueue.fl.ml.pack_train import StackedPack


def test_the_sliced_pre_sum_gives_the_whole_tensor_sum_bit_for_bit() -> None:
    generator = torch.Generator().manual_seed(0)
    size = 3 * (1 << 15) + 17  # several slices and a tail
    start = {"w": torch.randn(size, generator=generator), "b": torch.randn(4, 3, generator=generator)}
    start["steps"] = torch.tensor(7)
    trained = {name: start[name] + 1e-3 * torch.randn(3, *start[name].shape, generator=generator) for name in "wb"}
    samples = [30, 17, 25]
    pack = StackedPack(parameters=trained, global_state=start, samples=samples, losses=[0.0] * 3, steps=[2] * 3)

    summed = pack.weighted_delta_sum()

    weights = torch.tensor(samples, dtype=torch.float64)
    for name in "wb":
        difference = trained[name].to(torch.float64) - start[name].to(torch.float64)
        whole = (difference * weights.view((-1,) + (1,) * start[name].dim())).sum(0)
        assert summed[name].dtype == torch.float64 and torch.equal(summed[name], whole)
    assert torch.equal(summed["steps"], start["steps"])  # counters are the pack's, not summed
