"""Which torch device this process uses, and settings that make its kernels repeatable."""

from __future__ import annotations

import os

import torch

from fedqueue.core.process.gpus import visible_gpus


def torch_device() -> torch.device:
    """cuda:0 when a GPU is visible (workers pin theirs with CUDA_VISIBLE_DEVICES), else cpu."""
    return torch.device("cuda:0" if torch.cuda.is_available() else "cpu")


def host_to_device(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A fresh host tensor on the device, copied without the host waiting for the GPU's queue to drain
    (a copy from pageable memory would: through pinned memory it is asynchronous)."""
    if device.type != "cuda":
        return tensor.to(device)
    return tensor.pin_memory().to(device, non_blocking=True)


def device_label() -> str:
    """Human label naming the physical GPU, e.g. cuda:3 under CUDA_VISIBLE_DEVICES=3."""
    if not torch.cuda.is_available():
        return "cpu"
    visible = visible_gpus()
    # Inside the process the pinned GPU is always index 0; the variable holds its real name.
    return f"cuda:{visible[0] if visible else 0}"


def configure_determinism(threads: int) -> None:
    """Fix the CPU thread count and, on a GPU, force deterministic kernels.

    Call before the first CUDA operation: cuBLAS reads its workspace setting on start-up.
    """
    if threads < 1:
        raise ValueError(f"threads must be >= 1, got {threads}")
    torch.set_num_threads(threads)
    if torch.cuda.is_available():
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)
        torch.backends.cudnn.benchmark = False
        torch.backends.cudnn.deterministic = True
