"""FL's Python API: `fedqueue.run(config)` and friends, over the kind-neutral one in fedqueue.api.

import fedqueue
handle = fedqueue.run("examples/digits_fedavg.toml", rounds=3)
print(handle.status()["final_accuracy"])
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fedqueue.api import RunHandle as AnyRunHandle
from fedqueue.api import run as run_job
from fedqueue.api import runs
from fedqueue.config import DEFAULT_WORKER_SLOTS, Settings
from fedqueue.core.waits.outage import SubmitCutShort
from fedqueue.errors import ConfigError
from fedqueue.fl.config import RunConfig, load_run_config
from fedqueue.fl.scheduler import submit_run
from fedqueue.fl.store.results import list_rounds
from fedqueue.fl.strategy.common import final_state
from fedqueue.launch import Placement, check, keep_running, local_cluster, scheduling, with_plugins
from fedqueue.launch import submit as submit_job

if TYPE_CHECKING:
    import torch

    from fedqueue.core.services import Services, WorkerSlots

__all__ = [
    "ConfigLike",
    "RunConfig",
    "RunHandle",
    "RunSubmission",
    "keep_running",
    "load_config",
    "local_cluster",
    "run",
    "runs",
    "scheduling",
    "submit",
]

ConfigLike = RunConfig | Mapping[str, Any] | str | os.PathLike[str]


def load_config(config: ConfigLike, overrides: Mapping[str, Any] | None = None) -> RunConfig:
    """A validated RunConfig from a RunConfig, a dict or a TOML path, with overrides applied."""
    if isinstance(config, RunConfig):
        raw = config.to_dict()
    elif isinstance(config, Mapping):
        raw = dict(config)
    elif isinstance(config, (str, os.PathLike)):
        return load_run_config(Path(config), dict(overrides or {}))
    else:
        raise ConfigError(f"config: expected a dict, a path or a RunConfig, got {type(config).__name__}")
    raw.update(overrides or {})
    return RunConfig.from_dict(raw)


@dataclass(frozen=True)
class RunSubmission:
    """An FL run config as a job to submit; `announce` hears of the run once it is enqueued. `apart`: the submit's
    torch work (plugins checked, model built, pack trial) in a process of its own, for a command that follows
    the run and needs no torch after it (fl/submit/prepare.py)."""

    config: RunConfig
    announce: Callable[[str, RunConfig], object] | None = None
    apart: bool = False

    def check_before_start(self, settings: Settings) -> None:
        """The plugins the config names by import path import, are callable and take its options: checked before
        any worker starts. The built-ins need no such check (and would load torch here)."""
        from fedqueue.fl.ml.plugins import BUILTINS, check_options, resolve

        for kind, name in self.config.plugin_names().items():
            if name not in BUILTINS[kind]:
                check_options(kind, resolve(kind, name), self.config.plugin)

    def check(self, settings: Settings) -> None:
        """Every plugin the config names imports and takes its options (the config was checked when loaded), and
        its tensorboard_dir takes files here. Apart, the plugins are checked where the submit builds them."""
        check_tensorboard_dir(self.config)
        if not self.apart:
            from fedqueue.fl.setup import check_plugins  # imports torch: after the workers were started

            check_plugins(self.config)

    def submit(self, services: Services) -> str:
        config = self.config
        if config.tensorboard_dir is not None:  # the folder named here, wherever `fedqueue resume` runs later
            config = replace(config, tensorboard_dir=str(Path(config.tensorboard_dir).expanduser().resolve()))
        try:
            run_id = submit_run(services, config, apart=self.apart)
        except SubmitCutShort as cut:  # stored, its first tasks not all sent: its follower waits for the broker
            if self.announce is not None:
                self.announce(cut.run_id, config)
            raise
        if self.announce is not None:
            self.announce(run_id, config)
        return run_id


def check_tensorboard_dir(config: RunConfig) -> None:
    """A tensorboard_dir the config names is made here, and takes files; else ConfigError naming it."""
    if config.tensorboard_dir is not None:
        from fedqueue.fl.view.tensorboard import check_folder

        check_folder(config.tensorboard_dir)


class RunHandle(AnyRunHandle):
    """One submitted FL run: its status, its rounds and its final model."""

    def report(self) -> dict[str, Any]:
        """The status plus one row per round."""
        rounds = [
            {
                "round": row.round_index,
                "state": row.state,
                "selected": len(row.selected),
                "seconds": None if row.aggregated_at is None else row.aggregated_at - row.enqueued_at,
                "accuracy": row.accuracy,
                "loss": row.loss,
                "train_loss": row.train_loss,
            }
            for row in list_rounds(self.store, self.id)
        ]
        return {**self.status(), "rounds": rounds}

    def final_weights(self) -> dict[str, torch.Tensor]:
        """The latest checkpointed global model."""
        return final_state(self.store, self.id)


def submit(
    config: ConfigLike,
    *,
    settings: Settings | None = None,
    plugin_path: list[str] | None = None,
    worker_slots: WorkerSlots | None = None,
    **overrides: Any,
) -> RunHandle:
    """Validate, enqueue round 1 on the configured broker and return at once.

    `worker_slots`: the workers' slots by hostname where the caller knows them (a cluster it
    started, whose workers may not answer yet); else a submit that sizes packs asks the workers.
    """
    submission = RunSubmission(load_config(config, overrides))
    settings = with_plugins(settings, plugin_path)
    check(submission, settings)
    return RunHandle(submit_job(submission, Placement(settings, worker_slots)).id, settings)


def run(
    config: ConfigLike,
    *,
    settings: Settings | None = None,
    procs: int | None = None,
    slots: int = DEFAULT_WORKER_SLOTS,
    plugin_path: list[str] | None = None,
    timeout_s: float | None = None,
    **overrides: Any,
) -> RunHandle:
    """Submit and wait. With no broker configured: on the cluster `fedqueue up` left running for
    these settings, else on local workers started here (beside the submit) and stopped afterwards.

    A tensorboard_dir in the config gets the run's scalars as its rounds or versions are made."""
    submission = RunSubmission(load_config(config, overrides))
    handle = run_job(
        submission,
        with_plugins(settings, plugin_path),
        procs=procs,
        slots=slots,
        timeout_s=timeout_s,
        follower=_scalars,
    )
    return RunHandle.of(handle)


def _scalars(handle: AnyRunHandle) -> AbstractContextManager[Callable[[], object]]:
    """The run's TensorBoard scalars, written on each poll (where its config names a tensorboard_dir)."""
    from fedqueue.fl.view.tensorboard import following

    return following(handle.store, handle.id)
