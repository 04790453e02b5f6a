"""The job-kind registry: how the queue, the workers and the supervisor reach FL, LLM and later kinds.

A job kind is a `JobKind`: a name, its task handlers (each a Celery task name, a
queue and the callables that run a message, store its failure and refuse it) and
its repair pass, with hooks whose defaults suit a kind that needs none. Kinds register through the
`fedqueue.jobs` entry-point group, so the core never imports one: the arrows
point from a kind to the core, never back.
"""

from __future__ import annotations

import contextlib
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from importlib.metadata import entry_points
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from fedqueue.errors import ConfigError
from fedqueue.store.migrate import SchemaBranch

if TYPE_CHECKING:
    import typer

    from fedqueue.config import Settings
    from fedqueue.core.services import Services
    from fedqueue.store import Store

ENTRY_POINT_GROUP = "fedqueue.jobs"
# Scheduler steps (aggregations, round starts): consumed before any kind's queue, so they never wait behind one.
CONTROL_QUEUE = "control"


class TaskMessage(Protocol):
    """A task's message: JSON-only, with a key that counts its attempts and a label Flower shows."""

    def to_dict(self) -> dict[str, Any]: ...

    @property
    def attempt_key(self) -> str: ...

    @property
    def label(self) -> str: ...


@dataclass(frozen=True)
class TaskContext:
    """What a handler gets besides its message: this process's services, its name, which delivery this is."""

    services: Services
    worker: str
    attempt: int
    cache: Any  # the kind's per-process cache (models, data), made once by `JobKind.new_cache`


@dataclass(frozen=True)
class TaskHandler:
    name: str  # the Celery task name
    queue: str  # a queue suffix: the kind's own, or CONTROL_QUEUE
    # Its messages' class: `from_dict(raw)` decodes (MessageError when malformed), `to_dict()` encodes.
    message_type: type
    run: Callable[[TaskContext, Any], None]
    # Attempts used up (or the task ran out of time): store the outcome so the job goes on.
    give_up: Callable[[TaskContext, Any, int, str], None]
    # Why a well-formed message is not work its run sent (None: it is), read from the store before it runs:
    # (services, the kind's per-process cache, the message). A refused message is dead-lettered, never run.
    refusal: Callable[[Services, Any, Any], str | None] | None = None


@dataclass(frozen=True)
class Question:
    """Work a client asks of any worker and waits on, with no run behind it yet (the FL submit's model and pack
    trial, done where torch is loaded already): `answer` takes the question's JSON and returns JSON and bytes.
    Sent through the control queue and answered through the broker (fedqueue.queue.ask)."""

    name: str  # the Celery task name
    answer: Callable[[dict[str, Any]], tuple[dict[str, Any], bytes]]


@dataclass(frozen=True)
class ProgressBar:
    """One bar a follower shows: a round, a version, a job's prompts."""

    key: str  # the same bar across polls
    label: str
    completed: int
    total: int | None  # None: not known yet
    unit: str = ""
    note: str = ""
    finished: bool = False


class RunProgress(Protocol):
    """What a follower of one run reads on every poll, and how it waits for the next."""

    def bars(self) -> list[ProgressBar]: ...

    def wait(self, seconds: float) -> None: ...


class TaskProgress:
    """The bars of a kind that shows none of its own: one bar of the run's tasks that ended."""

    def __init__(self, store: Store, run_id: str) -> None:
        self.store = store
        self.run_id = run_id

    def bars(self) -> list[ProgressBar]:
        timings = self.store.task_timings(self.run_id)
        failed = sum(1 for timing in timings if timing.state != "done")
        note = f"{failed} failed" if failed else ""
        return [ProgressBar("tasks", "tasks", len(timings), None, unit="ended", note=note)]

    def wait(self, seconds: float) -> None:
        time.sleep(seconds)


class JobKind(ABC):
    """A job kind as the core reaches it: its name, its task handlers and its repair pass, and hooks whose
    defaults are those of a kind that needs none. The core calls every hook; none is optional by `None`.

    Its part of a run's status, report and `fedqueue runs` line is `fedqueue.report.kind.KindViews`, which a
    kind adds beside this class (those hooks take the report's own types, which the core does not import).
    """

    name: str
    handlers: tuple[TaskHandler, ...]
    questions: tuple[Question, ...] = ()
    # The folder of the kind's Alembic revisions, which make and change its own tables: a schema branch of its
    # own, recorded in the table alembic_version_NAME and upgraded after the core's (its tables may refer to runs).
    migrations: Path | None = None
    # Its commands go at the top (`fedqueue run CONFIG`) instead of under `fedqueue NAME`.
    commands_at_top: bool = False

    @abstractmethod
    def repair(self, services: Services, run_id: str) -> list[str]:
        """One repair pass over a run of this kind; what it did, one line per action."""

    def new_cache(self) -> object:
        """What a worker process keeps for this kind's tasks (models, data), made once: `TaskContext.cache`."""
        return None

    def retry_failed(self, services: Services, run_id: str) -> list[str]:
        """A failed run tried again (`fedqueue resume RUN --retry`): forget the stored failures that would stop it
        again at once (devices of a round still to aggregate); what it did, one line per action."""
        return []

    def task_scope(self, settings: Settings) -> AbstractContextManager[None]:
        """Process settings around each task of this kind (thread counts, deterministic kernels)."""
        return contextlib.nullcontext()

    def warm_up(self, settings: Settings) -> None:
        """Run once in a worker (kernels, imports), in a thread beside its first tasks: it must not change
        process-wide settings or draw from global random generators."""
        return None

    def commands(self) -> typer.Typer | None:
        """The kind's own commands, which the CLI adds as `fedqueue NAME ...` (imported only when asked for)."""
        return None

    def progress(self, services: Services, run_id: str) -> RunProgress:
        """The bars a follower (`fedqueue run`, `resume`) shows of a run of this kind."""
        return TaskProgress(services.store, run_id)

    def tensorboard(self, store: Store, run_id: str, root: Path) -> tuple[Path, int]:
        """`fedqueue report RUN --tensorboard ROOT`: the run's scalars as TensorBoard event files under ROOT;
        (the run's folder of event files, how many scalars were written). Refused before any folder is made."""
        raise ConfigError(f"--tensorboard: {self.name} runs have no TensorBoard scalars")

    def show_status(self, store: Store, run_id: str, as_json: bool, every_row: bool) -> bool:
        """Print a run of this kind for `fedqueue status RUN [--json] [--all]` (`every_row`: all of a long table,
        not its first and last rows); False where the kind has no view of its own and the core's is printed."""
        return False

    @property
    def queues(self) -> tuple[str, ...]:
        """Queue suffixes of this kind's own tasks (the control queue is everyone's)."""
        return tuple(sorted({handler.queue for handler in self.handlers if handler.queue != CONTROL_QUEUE}))


# Clear while this process's warm-up runs. Python's imports are not safe between threads where modules import each
# other in a cycle (torch's compiler stack: one thread may see the other's module half made), so a task about to
# import such modules itself (every task: its kind's scope sets torch's kernels) waits for it first.
_no_warm_up_running = threading.Event()
_no_warm_up_running.set()


def warm_up_started() -> None:
    """This process's warm-up runs from now (marked before its worker takes a task) until `warm_up_ended`."""
    _no_warm_up_running.clear()


def warm_up_ended() -> None:
    _no_warm_up_running.set()


def wait_for_warm_up(timeout_s: float) -> bool:
    """Wait until no warm-up runs in this process (at most `timeout_s`); False when it still runs."""
    return _no_warm_up_running.wait(timeout_s)


_lock = threading.Lock()
_kinds: dict[str, JobKind] = {}
# Handlers by message class, filled by `register`: the publisher looks one up per message.
_by_message_type: dict[type, TaskHandler] = {}
_loaded = False


def register(kind: JobKind) -> None:
    """Add a kind (entry points do this for installed kinds; tests may add their own)."""
    with _lock:
        _kinds[kind.name] = kind
        _by_message_type.update({handler.message_type: handler for handler in kind.handlers})


def _load_entry_points() -> None:
    global _loaded
    with _lock:
        if _loaded:
            return
        _loaded = True
    for point in entry_points(group=ENTRY_POINT_GROUP):
        kind = point.load()
        if not isinstance(kind, JobKind):
            raise ConfigError(f"job kind {point.name!r}: {point.value} is not a JobKind")
        register(kind)


def kinds() -> dict[str, JobKind]:
    _load_entry_points()
    with _lock:
        return dict(_kinds)


def get(name: str) -> JobKind:
    found = kinds().get(name)
    if found is None:
        raise ConfigError(f"job kind {name!r} is not installed (have: {', '.join(sorted(kinds())) or 'none'})")
    return found


def select(names: str | None) -> list[JobKind]:
    """The kinds a worker serves: a comma-separated list (`fl,llm`), or every installed kind."""
    if not names:
        return [kinds()[name] for name in sorted(kinds())]
    chosen = [part.strip() for part in names.split(",") if part.strip()]
    if not chosen:
        raise ConfigError("--jobs: name at least one job kind")
    return [get(name) for name in chosen]


def schema_branches() -> list[SchemaBranch]:
    """The schema branches of every installed kind that has tables of its own."""
    return [SchemaBranch(kind.name, kind.migrations) for kind in kinds().values() if kind.migrations is not None]


def handlers() -> Iterator[tuple[JobKind, TaskHandler]]:
    for kind in kinds().values():
        for handler in kind.handlers:
            yield kind, handler


def handler_for(message: object) -> TaskHandler:
    """The handler whose messages are of this message's class (what the publisher sends it as)."""
    _load_entry_points()
    handler = _by_message_type.get(type(message))
    if handler is None:
        raise LookupError(f"no job kind handles {type(message).__name__} messages")
    return handler
