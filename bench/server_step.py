"""FedRevive's server step per version: today's code against an earlier revision's, in the same run.

    .venv/bin/python bench/server_step.py                      # CPU scenarios, against git's HEAD~N
    .venv/bin/python bench/server_step.py --baseline-rev REV   # against another revision
    .venv/bin/python bench/server_step.py --baseline-dir DIR   # its synthesis.py and distill.py from DIR
    .venv/bin/python bench/server_step.py --gpu                # on cuda:0 (the baseline stays where it ran)

With a buffer of 1, FedRevive's server makes one version per arrival: it trains its generator
(`g_steps` steps against up to 8 teachers) and distils the current model into a student (10 steps,
one batch of 32 per teacher), one arrival after another. That step bounds a run's wall time. Each
scenario times it past the warm-ups (the adversarial term and the distillation both on), in their
CIFAR-10 settings: 8 teachers, 64 images per synthesis call, 2 generator steps, nz 256, ngf 128.

The baseline is the revision's own code, loaded from git, run as it ran: its teachers asked one by
one, its server step on the CPU (the revision never moved it to a GPU). Today's code asks the
teachers in one vmapped call. With `--gpu` it runs on cuda:0 and also counts the host syncs inside a
step (torch's sync debug mode), which the training steps should not need.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from common import REPO, ForeignLoad, machine, machine_line, markdown_table, ratio, wait_for_quiet  # noqa: E402

from fedqueue.fl.ml import distill, synthesis  # noqa: E402
from fedqueue.fl.ml.models import build_model  # noqa: E402
from fedqueue.fl.ml.teacher_stack import TeacherStack  # noqa: E402

BASELINE_FILES = ("synthesis.py", "distill.py")
SOURCE_DIR = "fedqueue/fl/ml"
CURRENT_ROUND = 200  # past FedRevive's warm-ups: the adversarial term and the distillation are on


@dataclass(frozen=True)
class Scenario:
    name: str
    model: str
    input_shape: tuple[int, ...]
    note: str


SCENARIOS = {
    "cnn": Scenario("cnn", "cnn", (3, 32, 32), "fedqueue's small CIFAR CNN (545k parameters)"),
    "mlp": Scenario("mlp", "mlp", (64,), "an MLP on 8x8 digits: what a step costs beyond its arithmetic"),
    "resnet": Scenario("resnet", "resnet18_fedrevive", (3, 32, 32), "their ResNet-18 without BatchNorm (11M)"),
}
SETTINGS: dict[str, Any] = {"synth_batch_size": 64, "g_steps": 2, "nz": 256, "ngf": 128}
KD = {"iters": 10, "lr": 1e-4, "batch_size": 32, "temperature": 1.0, "version": "distribution_match_batch"}
TEACHERS = 8
CLASSES = 10


def load_baseline(rev: str | None, directory: Path | None) -> tuple[ModuleType, ModuleType]:
    """The baseline's synthesis and distill modules, from a git revision or a folder."""
    if directory is None:
        assert rev is not None
        directory = Path(tempfile.mkdtemp(prefix="server-step-baseline-"))
        for name in BASELINE_FILES:
            text = subprocess.run(
                ["git", "show", f"{rev}:{SOURCE_DIR}/{name}"], cwd=REPO, check=True, capture_output=True, text=True
            ).stdout
            (directory / name).write_text(text)
    modules = []
    for name in BASELINE_FILES:
        spec = importlib.util.spec_from_file_location(f"baseline_{name[:-3]}", directory / name)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # dataclasses look their module up there
        spec.loader.exec_module(module)
        modules.append(module)
    return modules[0], modules[1]


def models(scenario: Scenario, device: torch.device, seed: int) -> tuple[list[torch.nn.Module], torch.nn.Module]:
    torch.manual_seed(seed)
    teachers = [build_model(scenario.model, scenario.input_shape, CLASSES).to(device) for _ in range(TEACHERS)]
    for teacher in teachers:
        teacher.eval().requires_grad_(False)
    return teachers, build_model(scenario.model, scenario.input_shape, CLASSES).to(device)


def proportions(seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.dirichlet(np.full(CLASSES, 0.5)) for _ in range(TEACHERS)]


def baseline_step(scenario: Scenario, old: tuple[ModuleType, ModuleType], device: torch.device) -> Callable[[], None]:
    """One server step of the baseline: its synthesizer, then its distillation, on its own lists of teachers."""
    old_synthesis, old_distill = old
    teachers, student = models(scenario, device, 0)
    shares = proportions(0)
    synth = old_synthesis.Synthesizer(old_synthesis.SynthesisSettings(**SETTINGS), scenario.input_shape, CLASSES)
    rng = np.random.default_rng(0)

    def step() -> None:
        synth.synthesize(teachers, shares, student, CURRENT_ROUND)
        inputs, labels = synth.pool()
        data = old_distill.KdData(inputs, labels, CLASSES)
        old_distill.distil(student, teachers, shares, data, rng, augment=synth.augment, **KD)

    return step


def current_step(scenario: Scenario, device: torch.device) -> Callable[[], None]:
    """One server step of today's code, as fl/strategy/fedrevive/revive.py makes it."""
    teachers, student = models(scenario, device, 0)
    shares = proportions(0)
    settings = synthesis.SynthesisSettings(**SETTINGS, adv_gate="version")
    synth = synthesis.Synthesizer(settings, scenario.input_shape, CLASSES)
    rng = np.random.default_rng(0)
    table = torch.as_tensor(np.stack(shares))

    def step() -> None:
        stack = TeacherStack(teachers)
        student.requires_grad_(False)
        synth.synthesize(stack, table, student, CURRENT_ROUND)
        student.requires_grad_(True)
        inputs, labels = synth.pool()
        data = distill.KdData(inputs, labels, CLASSES)
        distill.distil(
            student,
            stack,
            shares,
            data,
            rng,
            augment=synth.augment,
            weight_decay=1e-5,
            guard=synth.windows["kd"],
            **KD,
        )

    return step


def timed(step: Callable[[], None], device: torch.device) -> float:
    start = time.perf_counter()
    step()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start


def host_syncs(step: Callable[[], None]) -> int:
    """How many operations in one step made the host wait on the GPU (torch's sync debug mode)."""
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            step()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return sum("synchroniz" in str(warning.message) for warning in caught)


def run(scenario: Scenario, old: tuple[ModuleType, ModuleType], steps: int, gpu: bool, cpu_too: bool) -> list[Any]:
    cpu = torch.device("cpu")
    device = torch.device("cuda:0") if gpu else cpu
    ways = {
        "baseline (CPU)": (baseline_step(scenario, old, cpu), cpu),
        "today": (current_step(scenario, device), device),
    }
    if gpu and cpu_too:
        ways["today (CPU)"] = (current_step(scenario, cpu), cpu)
    for step, where in ways.values():
        for _ in range(2 if where.type == "cuda" else 1):  # warm-up: the pool's first batch, kernels chosen
            timed(step, where)
    times: dict[str, list[float]] = {name: [] for name in ways}
    for _ in range(steps):  # in turn, so drift in the machine's speed reaches every way alike
        for name, (step, where) in ways.items():
            times[name].append(timed(step, where))
    medians = {name: statistics.median(values) for name, values in times.items()}
    syncs = host_syncs(ways["today"][0]) if gpu else None
    rows = []
    for name, median in medians.items():
        spread = f"{min(times[name]):.3f}-{max(times[name]):.3f}"
        rows.append(
            [
                scenario.name,
                name,
                f"{median:.3f}",
                spread,
                ratio(medians["baseline (CPU)"], median),
                syncs if name == "today" and syncs is not None else "",
            ]
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline-rev", default="ccb7436", help="the revision whose code is the baseline")
    parser.add_argument("--baseline-dir", type=Path, help="a folder holding the baseline's synthesis.py and distill.py")
    parser.add_argument("--scenarios", default="mlp,cnn", help=f"comma-separated, of {', '.join(SCENARIOS)}")
    parser.add_argument("--steps", type=int, default=5, help="timed server steps per way")
    parser.add_argument("--gpu", action="store_true", help="run today's code on cuda:0")
    parser.add_argument("--gpu-only", action="store_true", help="with --gpu: skip today's code on the CPU")
    parser.add_argument("--no-wait", action="store_true", help="start without waiting for a quiet machine")
    args = parser.parse_args()
    if args.gpu and not torch.cuda.is_available():
        parser.error("--gpu: no CUDA device is visible")
    old = load_baseline(args.baseline_rev, args.baseline_dir)
    if not args.no_wait:
        wait_for_quiet()
    info = machine()
    print(machine_line(info))
    load = ForeignLoad()
    headers = ["scenario", "way", "s per version (median)", "min-max", "vs baseline", "host syncs in a step"]
    for name in args.scenarios.split(","):
        if name not in SCENARIOS:
            parser.error(f"--scenarios: unknown scenario {name!r} (known: {', '.join(SCENARIOS)})")
        scenario = SCENARIOS[name]
        print(f"{scenario.name}: {scenario.note}", flush=True)
        rows = run(scenario, old, args.steps, args.gpu, not args.gpu_only)
        print(markdown_table(headers, rows), flush=True)  # each scenario as it ends
    print(load.report())


if __name__ == "__main__":
    main()
