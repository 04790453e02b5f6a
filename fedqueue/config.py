"""Service settings: the only reader of FEDQUEUE_* environment variables."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from urllib.parse import parse_qsl, quote, urlencode, urlsplit, urlunsplit

from fedqueue.errors import ConfigError

# Defaults of the settings users can change, each with the variable (or option) that changes it.
DEFAULT_DATABASE_URL = "sqlite:///fedqueue.db"  # FEDQUEUE_DATABASE_URL: a SQLite file in the working folder
DEFAULT_KEY_PREFIX = "fedqueue"  # FEDQUEUE_KEY_PREFIX: starts every Redis key and queue name
# FEDQUEUE_BLOB_TTL_S: how long blobs, attempt counts and requeue marks stay in Redis.
DEFAULT_BLOB_TTL_S = 7 * 24 * 3600
# FEDQUEUE_BLOB_SHM: whether workers on one host share blobs as files in shared memory (see Settings.blob_shm).
BLOB_SHM_MODES = ("auto", "local", "shared", "off")
DEFAULT_BLOB_SHM_DIR = "/dev/shm"  # FEDQUEUE_BLOB_SHM_DIR: the shared-memory folder those files go in
DEFAULT_THREADS_PER_TASK = 1  # FEDQUEUE_THREADS_PER_TASK: torch threads of one task
DEFAULT_TASK_TIME_LIMIT_S = 3600  # FEDQUEUE_TASK_TIME_LIMIT_S: a task running longer ends its worker process
DEFAULT_MAX_ATTEMPTS = 3  # FEDQUEUE_MAX_ATTEMPTS: attempts whose code raised before a task is stored failed
# FEDQUEUE_MAX_LOST_ATTEMPTS: attempts lost with their worker (killed, crashed, gone) before a task is stored failed;
# more than raised ones, since pre-emption and the OOM killer take workers through no fault of the task.
DEFAULT_MAX_LOST_ATTEMPTS = 10
# FEDQUEUE_HEARTBEAT_TTL_S: a running task's heartbeat key lives this long; a task whose key expired has lost its worker.
DEFAULT_HEARTBEAT_TTL_S = 15
DEFAULT_LEASE_TTL_S = 15  # FEDQUEUE_LEASE_TTL_S: how long a scheduler's lease on a run outlives its last renewal
# FEDQUEUE_BROKER_WAIT_S: how long a command following a run waits for an unreachable broker before it gives up,
# and a worker's write for room in a broker at its maxmemory.
DEFAULT_BROKER_WAIT_S = 600
DEFAULT_STORE_WAIT_S = 600  # FEDQUEUE_STORE_WAIT_S: the same for a store that refuses it (disk full, read-only, down)
# FEDQUEUE_NO_WORKER_S: how long a run's tasks wait on a queue no worker reads before its follower says so.
DEFAULT_NO_WORKER_S = 60
# Worker processes (`--slots`, `--gpus-per-worker`, `--procs-per-gpu` and `fedqueue.api.local_cluster`).
DEFAULT_WORKER_SLOTS = 1  # concurrent tasks per worker process
DEFAULT_GPUS_PER_WORKER = 1  # GPUs one worker process spreads a model over
DEFAULT_PROCS_PER_GPU = 1  # worker processes sharing one GPU
# FEDQUEUE_WORKER_FREED_MEMORY_MB: freed memory a worker process keeps for its next allocations
# (fedqueue.core.process.kept_memory); 0 leaves the allocator as it is.
DEFAULT_WORKER_FREED_MEMORY_MB = 1024
FREED_MEMORY_MB_MAX = 2047  # glibc's mallopt takes an int of bytes


def _int(env: Mapping[str, str], name: str, default: int, minimum: int = 1) -> int:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"{name}: expected an integer, got {raw!r}") from None
    if value < minimum:
        raise ConfigError(f"{name}: must be at least {minimum}, got {value}")
    return value


def _url(env: Mapping[str, str], name: str) -> str | None:
    """The URL in `name`, refused in one line when its host or port cannot be read (the URL itself is not
    repeated: it may hold a password)."""
    raw = env.get(name) or None
    if raw is None:
        return None
    try:
        _ = urlsplit(raw).port  # its port is parsed only when asked for
    except ValueError as err:
        reason = str(err)
        raise ConfigError(f"{name}: not a valid URL ({reason[:1].lower()}{reason[1:]})") from None
    return raw


DATABASE_URL_FORMS = "sqlite:///PATH or postgresql://USER@HOST/DB"


def database_url_problem(url: str) -> str | None:
    """What is wrong with a store URL as written (its scheme, SQLite's slashes), or None; read without
    connecting, so that a typo is refused before any broker or worker starts."""
    scheme, sep, rest = url.partition("://")
    backend = scheme.split("+")[0].lower()
    if not sep or not backend:
        return f"not a database URL (expected {DATABASE_URL_FORMS})"
    if backend == "postgres":
        return "postgres:// is not understood: write postgresql://"
    if backend not in ("sqlite", "postgresql"):
        return f"unsupported database {backend!r} (use {DATABASE_URL_FORMS})"
    host = urlsplit(url).netloc.rpartition("@")[2]  # no user or password repeated
    if backend == "sqlite" and host:
        return (
            f"{scheme}://{host} makes {host!r} a host name; a SQLite file takes three slashes: {scheme}:///{host}"
            f" (four for an absolute path: {scheme}:////path/to/{host})"
        )
    return None


def memory_sqlite(url: str) -> bool:
    """An in-memory SQLite database: it lives and dies with the one process that opens it."""
    parts = urlsplit(url)
    if not parts.scheme.lower().startswith("sqlite"):
        return False
    return parts.path in ("", "/", "/:memory:") or "mode=memory" in parts.query


def _database_url(env: Mapping[str, str]) -> str:
    url = _url(env, "FEDQUEUE_DATABASE_URL") or DEFAULT_DATABASE_URL
    problem = database_url_problem(url)
    if problem is not None:
        raise ConfigError(f"FEDQUEUE_DATABASE_URL: {problem}")
    return url


def _plugin_path(env: Mapping[str, str]) -> tuple[str, ...]:
    """FEDQUEUE_PLUGIN_PATH's folders; one that is not a folder is refused (a typo would only show as a plugin
    that does not import)."""
    folders = tuple(part for part in (env.get("FEDQUEUE_PLUGIN_PATH") or "").split(os.pathsep) if part)
    for folder in folders:
        if not os.path.isdir(folder):
            raise ConfigError(f"FEDQUEUE_PLUGIN_PATH: folder {folder!r} does not exist")
    return folders


def _blob_dir(env: Mapping[str, str]) -> str | None:
    """FEDQUEUE_BLOB_DIR: a folder, or one to make in a folder that exists; refused where neither can be written
    (a typo would make a tree of folders wherever it points)."""
    folder = env.get("FEDQUEUE_BLOB_DIR") or None
    if folder is None:
        return None
    name = "FEDQUEUE_BLOB_DIR"
    if os.path.exists(folder):
        if not os.path.isdir(folder):
            raise ConfigError(f"{name}: {folder!r} is a file, not a folder")
        if not os.access(folder, os.W_OK | os.X_OK):
            raise ConfigError(f"{name}: folder {folder!r} cannot be written")
        return folder
    parent = os.path.dirname(os.path.abspath(folder))
    if not os.path.isdir(parent):
        raise ConfigError(f"{name}: folder {folder!r} does not exist, nor does the folder {parent!r} to make it in")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ConfigError(f"{name}: folder {folder!r} does not exist and cannot be made in {parent!r}")
    return folder


def _blob_shm(env: Mapping[str, str]) -> str:
    mode = (env.get("FEDQUEUE_BLOB_SHM") or "auto").lower()
    if mode not in BLOB_SHM_MODES:
        raise ConfigError(f"FEDQUEUE_BLOB_SHM: expected one of {', '.join(BLOB_SHM_MODES)}, got {mode!r}")
    return mode


def _blob_shm_dir(env: Mapping[str, str]) -> str:
    folder = env.get("FEDQUEUE_BLOB_SHM_DIR") or None
    if folder is None or folder == DEFAULT_BLOB_SHM_DIR:  # a host without it: blobs go to Redis (shm_root)
        return DEFAULT_BLOB_SHM_DIR
    if not os.path.isdir(folder):
        raise ConfigError(f"FEDQUEUE_BLOB_SHM_DIR: folder {folder!r} does not exist")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise ConfigError(f"FEDQUEUE_BLOB_SHM_DIR: folder {folder!r} cannot be written")
    return folder


def _freed_memory_mb(env: Mapping[str, str]) -> int:
    name = "FEDQUEUE_WORKER_FREED_MEMORY_MB"
    value = _int(env, name, DEFAULT_WORKER_FREED_MEMORY_MB, minimum=0)
    if value > FREED_MEMORY_MB_MAX:
        raise ConfigError(f"{name}: at most {FREED_MEMORY_MB_MAX} (MiB), got {value}")
    return value


MESSAGE_KEY_MIN = 16  # characters of FEDQUEUE_MESSAGE_KEY: a short secret is guessed


def _message_key(env: Mapping[str, str]) -> str | None:
    key = env.get("FEDQUEUE_MESSAGE_KEY") or None
    if key is not None and len(key) < MESSAGE_KEY_MIN:
        raise ConfigError(f"FEDQUEUE_MESSAGE_KEY: at least {MESSAGE_KEY_MIN} characters, got {len(key)}")
    return key


@dataclass(frozen=True)
class Settings:
    """Where the services are and how workers behave.

    `broker_url` None means "no broker configured": the CLI then starts an
    embedded Redis of its own and never touches any other.
    """

    broker_url: str | None = None
    """FEDQUEUE_BROKER_URL, FEDQUEUE_REDIS_PASSWORD: the Redis URL of the queue (and of the blobs), and a
    password filled into it, so the secret can stay out of the URL. Unset: commands use the cluster `fedqueue up`
    left running, else start an embedded Redis of their own."""
    database_url: str = DEFAULT_DATABASE_URL
    """FEDQUEUE_DATABASE_URL: the store, a SQLite file (`sqlite:///PATH`) or `postgresql://...`."""
    key_prefix: str = DEFAULT_KEY_PREFIX
    """FEDQUEUE_KEY_PREFIX: starts every Redis key and queue name (letters, digits, '-', '_' and '.')."""
    blob_dir: str | None = None
    """FEDQUEUE_BLOB_DIR: a folder shared by every node to keep model blobs in; unset: blobs live in Redis."""
    blob_ttl_s: int = DEFAULT_BLOB_TTL_S
    """FEDQUEUE_BLOB_TTL_S: seconds blobs, attempt counts and requeue marks stay in Redis (and blob files in
    shared memory)."""
    blob_shm: str = "auto"
    """FEDQUEUE_BLOB_SHM: how workers on one host share model blobs. `local`: as files in shared memory only (every
    process of the deployment on this host); `shared`: those files, plus a copy in Redis (or FEDQUEUE_BLOB_DIR)
    for workers on other hosts; `auto` (the default): `local` when the broker is reached by a loopback or unix://
    URL and listens on loopback alone (its `bind`, as a `fedqueue up` cluster's Redis), else `shared`; `off`: blobs
    only in Redis (or FEDQUEUE_BLOB_DIR).
    Use `shared` or `off` where a worker reaches a loopback broker without seeing this host's shared memory
    (a container with its own /dev/shm)."""
    blob_shm_dir: str = field(default_factory=lambda: DEFAULT_BLOB_SHM_DIR)  # read when made: tests point it away
    """FEDQUEUE_BLOB_SHM_DIR: the shared-memory folder blob files go in (a tmpfs; one sub-folder per user and
    cluster); when the default /dev/shm is missing, blobs go to Redis."""
    threads_per_task: int = DEFAULT_THREADS_PER_TASK
    """FEDQUEUE_THREADS_PER_TASK: torch threads of one task (never derived from the machine: the same training with
    1 and 2 threads differs in the last bits)."""
    task_time_limit_s: int = DEFAULT_TASK_TIME_LIMIT_S
    """FEDQUEUE_TASK_TIME_LIMIT_S: hard limit of one task in seconds, enforced by ending its worker process; the
    queue's visibility timeout is set above it."""
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    """FEDQUEUE_MAX_ATTEMPTS: attempts of a task (device, aggregation, fold pass, LLM batch) whose own code raised
    (or ran past the time limit) before it is stored as failed."""
    max_lost_attempts: int = DEFAULT_MAX_LOST_ATTEMPTS
    """FEDQUEUE_MAX_LOST_ATTEMPTS: attempts of a task lost with their worker (killed, crashed, pre-empted) before it
    is stored as failed; counted apart from raised ones."""
    heartbeat_ttl_s: int = DEFAULT_HEARTBEAT_TTL_S
    """FEDQUEUE_HEARTBEAT_TTL_S: seconds a running task's heartbeat, and an aggregation claim, live unrenewed: how
    soon a lost task or aggregator is noticed (at least 2)."""
    lease_ttl_s: int = DEFAULT_LEASE_TTL_S
    """FEDQUEUE_LEASE_TTL_S: seconds a dead scheduler's lease on a run blocks `fedqueue resume` (and a worker
    launcher's adoption) after its last renewal (at least 2)."""
    broker_wait_s: int = DEFAULT_BROKER_WAIT_S
    """FEDQUEUE_BROKER_WAIT_S: seconds a command following a run (`run`, `resume`, `llm submit`, `fedqueue.run()`)
    waits for an unreachable broker before it exits, naming `fedqueue resume RUN`."""
    store_wait_s: int = DEFAULT_STORE_WAIT_S
    """FEDQUEUE_STORE_WAIT_S: the same for a store that refuses the follower (disk full, read-only, unreachable)."""
    no_worker_s: int = DEFAULT_NO_WORKER_S
    """FEDQUEUE_NO_WORKER_S: seconds a run's tasks wait on a queue no worker reads before its follower says so."""
    visibility_timeout_override_s: int | None = None
    """FEDQUEUE_VISIBILITY_TIMEOUT_S: seconds before the queue hands an unacknowledged task out again; unset (the
    safe default): twice the task time limit plus 60 s, so a running task is never handed out twice. Set shorter
    only to provoke redelivery in tests."""
    plugin_path: tuple[str, ...] = ()
    """FEDQUEUE_PLUGIN_PATH: folders to import plugins from, by workers and by the submitting process, separated
    by `:` (`--plugin-path` adds to them)."""
    model_cache: str | None = None
    """FEDQUEUE_MODEL_CACHE: the folder where workers keep GGUF models converted for fast loading, one converted
    copy per file, dtype and transformers version, made by the first load on the host; unset:
    `~/.cache/fedqueue/models` (`$XDG_CACHE_HOME/fedqueue/models`); `off`: every load reads the GGUF file."""
    jobs: str | None = None
    """FEDQUEUE_JOBS: the job kinds a worker serves, comma-separated (`fl,llm`); unset: every installed kind
    (`fedqueue worker --jobs`)."""
    worker_freed_memory_mb: int = DEFAULT_WORKER_FREED_MEMORY_MB
    """FEDQUEUE_WORKER_FREED_MEMORY_MB: MiB of freed memory a worker process keeps to reuse (at most 2047), where
    glibc would hand it back to the kernel and have every page of the next model-sized tensor found and zeroed
    anew; 0: the allocator as it is (also where MALLOC_* or GLIBC_TUNABLES tune it, or LD_PRELOAD is set)."""
    message_key: str | None = field(default=None, repr=False)
    """FEDQUEUE_MESSAGE_KEY: a secret shared by every process of a deployment (at least 16 characters); set,
    task messages are signed (HMAC-SHA256) and workers run only those whose signature matches, dead-lettering
    the rest. Unset: messages are not signed, and anyone who can write to Redis can queue tasks."""

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        env = os.environ if env is None else env
        prefix = env.get("FEDQUEUE_KEY_PREFIX") or DEFAULT_KEY_PREFIX
        if not prefix.replace("-", "").replace("_", "").replace(".", "").isalnum():
            raise ConfigError(f"FEDQUEUE_KEY_PREFIX: only letters, digits, '-', '_' and '.' allowed, got {prefix!r}")
        broker_url = _url(env, "FEDQUEUE_BROKER_URL")
        return cls(
            broker_url=with_password(broker_url, env.get("FEDQUEUE_REDIS_PASSWORD")),
            database_url=_database_url(env),
            key_prefix=prefix,
            blob_dir=_blob_dir(env),
            blob_ttl_s=_int(env, "FEDQUEUE_BLOB_TTL_S", cls.blob_ttl_s),
            blob_shm=_blob_shm(env),
            blob_shm_dir=_blob_shm_dir(env),
            threads_per_task=_int(env, "FEDQUEUE_THREADS_PER_TASK", cls.threads_per_task),
            task_time_limit_s=_int(env, "FEDQUEUE_TASK_TIME_LIMIT_S", cls.task_time_limit_s),
            max_attempts=_int(env, "FEDQUEUE_MAX_ATTEMPTS", cls.max_attempts),
            max_lost_attempts=_int(env, "FEDQUEUE_MAX_LOST_ATTEMPTS", cls.max_lost_attempts),
            heartbeat_ttl_s=_int(env, "FEDQUEUE_HEARTBEAT_TTL_S", cls.heartbeat_ttl_s, minimum=2),
            lease_ttl_s=_int(env, "FEDQUEUE_LEASE_TTL_S", cls.lease_ttl_s, minimum=2),
            broker_wait_s=_int(env, "FEDQUEUE_BROKER_WAIT_S", cls.broker_wait_s),
            store_wait_s=_int(env, "FEDQUEUE_STORE_WAIT_S", cls.store_wait_s),
            no_worker_s=_int(env, "FEDQUEUE_NO_WORKER_S", cls.no_worker_s),
            visibility_timeout_override_s=(
                _int(env, "FEDQUEUE_VISIBILITY_TIMEOUT_S", 0) if env.get("FEDQUEUE_VISIBILITY_TIMEOUT_S") else None
            ),
            plugin_path=_plugin_path(env),
            jobs=env.get("FEDQUEUE_JOBS") or None,
            message_key=_message_key(env),
            worker_freed_memory_mb=_freed_memory_mb(env),
            model_cache=env.get("FEDQUEUE_MODEL_CACHE") or None,
        )

    def check_lasting_store(self) -> None:
        """Refuse, before anything starts, a store that the workers and later commands cannot share: a URL
        written wrong, an in-memory SQLite database (the run would live only in this process), a SQLite file
        in a folder that does not exist."""
        name = "FEDQUEUE_DATABASE_URL"
        problem = database_url_problem(self.database_url)
        if problem is not None:
            raise ConfigError(f"{name}: {problem}")
        if memory_sqlite(self.database_url):
            raise ConfigError(
                f"{name}: {mask_url(self.database_url)} is an in-memory SQLite database, seen only by the process"
                " that opens it: the workers and later commands would never see the run; use a file"
                " (sqlite:///fedqueue.db) or Postgres"
            )
        path = urlsplit(self.database_url).path[1:] if self.database_url.lower().startswith("sqlite") else ""
        folder = os.path.dirname(os.path.abspath(path)) if path else ""
        if folder and not os.path.isdir(folder):
            raise ConfigError(f"{name}: the folder {folder!r} of the SQLite file does not exist")

    def with_broker(self, broker_url: str) -> Settings:
        return replace(self, broker_url=broker_url)

    def with_jobs(self, jobs: str | None) -> Settings:
        return self if jobs is None else replace(self, jobs=jobs)

    def with_plugin_path(self, folders: list[str] | tuple[str, ...] | None) -> Settings:
        """These settings plus plugin folders (made absolute: workers may start elsewhere)."""
        if not folders:
            return self
        for folder in folders:
            if not os.path.isdir(folder):
                raise ConfigError(f"--plugin-path: folder {folder!r} does not exist")
        added = tuple(os.path.abspath(folder) for folder in folders)
        return replace(self, plugin_path=self.plugin_path + added)

    def activate_plugin_path(self) -> None:
        """Make plugin folders importable in this process."""
        for folder in reversed(self.plugin_path):
            if folder not in sys.path:
                sys.path.insert(0, folder)

    @property
    def visibility_timeout_s(self) -> int:
        # Above the hard time limit, so a task still running is never handed out twice.
        if self.visibility_timeout_override_s is not None:
            return self.visibility_timeout_override_s
        return self.task_time_limit_s * 2 + 60

    def queue(self, suffix: str) -> str:
        """A queue's full name: `devices` (FL device tasks), `control` (scheduler steps), a kind's own."""
        return f"{self.key_prefix}.{suffix}"

    def to_env(self) -> dict[str, str]:
        """The environment that gives a child process these same settings."""
        env = {
            "FEDQUEUE_DATABASE_URL": self.database_url,
            "FEDQUEUE_KEY_PREFIX": self.key_prefix,
            "FEDQUEUE_BLOB_TTL_S": str(self.blob_ttl_s),
            "FEDQUEUE_BLOB_SHM": self.blob_shm,
            # Always: a child must put blob files where this process reads them, whatever its own environment says.
            "FEDQUEUE_BLOB_SHM_DIR": self.blob_shm_dir,
            "FEDQUEUE_THREADS_PER_TASK": str(self.threads_per_task),
            "FEDQUEUE_TASK_TIME_LIMIT_S": str(self.task_time_limit_s),
            "FEDQUEUE_MAX_ATTEMPTS": str(self.max_attempts),
            "FEDQUEUE_MAX_LOST_ATTEMPTS": str(self.max_lost_attempts),
            "FEDQUEUE_HEARTBEAT_TTL_S": str(self.heartbeat_ttl_s),
            "FEDQUEUE_LEASE_TTL_S": str(self.lease_ttl_s),
            "FEDQUEUE_BROKER_WAIT_S": str(self.broker_wait_s),
            "FEDQUEUE_STORE_WAIT_S": str(self.store_wait_s),
            "FEDQUEUE_NO_WORKER_S": str(self.no_worker_s),
            "FEDQUEUE_WORKER_FREED_MEMORY_MB": str(self.worker_freed_memory_mb),
        }
        if self.visibility_timeout_override_s is not None:
            env["FEDQUEUE_VISIBILITY_TIMEOUT_S"] = str(self.visibility_timeout_override_s)
        if self.broker_url:
            env["FEDQUEUE_BROKER_URL"] = self.broker_url
        if self.blob_dir:
            env["FEDQUEUE_BLOB_DIR"] = self.blob_dir
        if self.plugin_path:
            env["FEDQUEUE_PLUGIN_PATH"] = os.pathsep.join(self.plugin_path)
        if self.jobs:
            env["FEDQUEUE_JOBS"] = self.jobs
        if self.message_key:
            env["FEDQUEUE_MESSAGE_KEY"] = self.message_key
        if self.model_cache:
            env["FEDQUEUE_MODEL_CACHE"] = self.model_cache
        return env


LOOPBACK_HOSTS = {"localhost", "127.0.0.1", "::1"}


def with_password(url: str | None, password: str | None) -> str | None:
    """The broker URL with FEDQUEUE_REDIS_PASSWORD filled in, so the secret can stay out of the URL."""
    if not url or not password:
        return url
    parts = urlsplit(url)
    if parts.password is not None or not parts.hostname:
        return url
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    if parts.port:
        host = f"{host}:{parts.port}"
    netloc = f"{parts.username or ''}:{quote(password, safe='')}@{host}"
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def broker_on_this_host(url: str) -> bool:
    """A broker reached through a unix socket or a loopback address (it may listen on others too)."""
    parts = urlsplit(url)
    return parts.scheme == "unix" or parts.hostname in LOOPBACK_HOSTS


def broker_address(url: str | None) -> str:
    """Where the broker is, the same for every URL that reaches it from this host: no credentials or options,
    one name for loopback."""
    parts = urlsplit(url or "")
    if parts.scheme == "unix":
        return f"unix:{parts.path}"
    host = "loopback" if parts.hostname in LOOPBACK_HOSTS else parts.hostname
    return f"{parts.scheme}://{host}:{parts.port or 6379}/{parts.path.strip('/') or '0'}"


def insecure_broker(url: str | None) -> bool:
    """A Redis beyond loopback with no password: anyone who reaches it can run tasks."""
    if not url:
        return False
    parts = urlsplit(url)
    return parts.scheme in ("redis", "rediss") and parts.password is None and parts.hostname not in LOOPBACK_HOSTS


def mask_url(url: str | None) -> str:
    """The URL with its password replaced, fit for logs and error lines."""
    if not url:
        return "<none>"
    parts = urlsplit(url)
    query = urlencode(
        [(key, "***" if key.lower() == "password" else value) for key, value in parse_qsl(parts.query)], safe="*"
    )
    if parts.password is None:
        return urlunsplit(parts._replace(query=query)) if parts.query else url
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"  # an IPv6 address keeps its brackets
    if parts.port:
        host = f"{host}:{parts.port}"
    user = parts.username or ""
    netloc = f"{user}:***@{host}"
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))
