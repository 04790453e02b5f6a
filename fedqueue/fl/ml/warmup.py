"""Pay torch's one-time start-up costs (imports, kernels, thread pools) once per worker process.

The warm-up runs in a thread beside the worker's first tasks, so it must leave every
process-wide state a task reads as it found it: it draws from its own generator only,
never from torch's global one, which tasks seed and draw from.
"""

from __future__ import annotations


def warm_up() -> None:
    """One tiny forward/backward/optimizer step: torch imports its modules and initialises its kernels once."""
    import torch
    import torch.nn.functional as F

    generator = torch.Generator().manual_seed(0)
    conv = torch.rand(2, 1, 3, 3, generator=generator, requires_grad=True)
    linear = torch.rand(2, 72, generator=generator, requires_grad=True)
    # An optimizer's first construction imports torch._dynamo: the costliest part of the warm-up.
    optimizer = torch.optim.SGD([conv, linear], lr=0.1, momentum=0.5)
    inputs = torch.rand(4, 1, 8, 8, generator=generator)
    logits = F.linear(F.conv2d(inputs, conv).flatten(1), linear)
    F.cross_entropy(logits, torch.tensor([0, 1, 0, 1])).backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
