"""A device's class proportions estimated from what it uploads, when the server may not know its labels.

FedRevive's data-free synthesis weighs each teacher by how much of each class its device holds.
The authors' simulator reads the devices' true label histograms; their FLARE port (NVFlare PR
#5274) can estimate them instead: it shows each of a device's first uploads the same fixed probes
(standard normal noise, drawn once from the run's seed, fed as they are), takes the mean of its
softmax at temperature 0.8, and averages that over the uploads seen. The estimate is used from the
first upload on and frozen after the second.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn


class ProportionProxy:
    """Running sums of the devices' probe outputs, and how many uploads each sum holds."""

    def __init__(
        self,
        input_shape: tuple[int, ...],
        num_classes: int,
        seed: int,
        *,
        uploads: int = 2,
        temperature: float = 0.8,
        probes: int = 64,
    ) -> None:
        generator = torch.Generator(device="cpu").manual_seed(seed)  # as PR #5274 seeds its probes
        self.probes = torch.randn((probes, *input_shape), generator=generator)
        self.num_classes, self.uploads, self.temperature = num_classes, uploads, temperature
        self.sums: dict[int, Tensor] = {}
        self.seen: dict[int, int] = {}

    def wants(self, device: int) -> bool:
        """Whether this device's next upload still changes its estimate."""
        return self.seen.get(device, 0) < self.uploads

    def observe(self, device: int, model: nn.Module) -> None:
        """Count one upload of the device (its returned model), if its estimate is not frozen yet."""
        if not self.wants(device):
            return
        parameter = next(model.parameters())
        model.eval()
        with torch.no_grad():
            logits = model(self.probes.to(parameter.device))
            probabilities = F.softmax(logits / self.temperature, dim=1).mean(dim=0).to(torch.float64).cpu()
        self.sums[device] = self.sums.get(device, torch.zeros(self.num_classes, dtype=torch.float64)) + probabilities
        self.seen[device] = self.seen.get(device, 0) + 1

    def of(self, device: int) -> np.ndarray:
        """The device's estimated proportions; uniform before it uploaded anything."""
        if device not in self.sums:
            return np.full(self.num_classes, 1.0 / self.num_classes)
        estimate: np.ndarray = (self.sums[device] / self.seen[device]).numpy()
        return estimate

    def state_dict(self) -> dict[str, Tensor]:
        devices = sorted(self.sums)
        sums = torch.stack([self.sums[d] for d in devices]) if devices else torch.zeros((0, self.num_classes))
        return {
            "devices": torch.tensor(devices, dtype=torch.int64),
            "seen": torch.tensor([self.seen[d] for d in devices], dtype=torch.int64),
            "sums": sums.to(torch.float64),
        }

    def load_state_dict(self, state: Mapping[str, Tensor]) -> None:
        devices = state["devices"].tolist()
        self.sums = {device: state["sums"][row].clone() for row, device in enumerate(devices)}
        self.seen = {device: int(state["seen"][row]) for row, device in enumerate(devices)}
