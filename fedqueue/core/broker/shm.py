"""Blobs as files in this host's shared memory (a tmpfs), over Redis or a shared folder for other hosts.

Workers on one host hand each other a 45 MB state as a file: written once into a partial file, renamed into
place (no reader ever sees half a file), read back by mmap. A blob lives at ROOT/<key>/<digest>, named by the
digest its ref carries, so a reader opens exactly the file its ref names and needs no hash of its content:

- one host (`local`): nothing but this host reads the blobs. A blob written from tensors is named by a fresh
  random tag (no sha256 of 45 MB at all); one written from bytes by its sha256.
- other hosts too (`shared`): every blob also goes to the remote store (Redis or the shared folder) under its
  sha256, which readers elsewhere check as before; readers here take the file.

Where the folder is full, a blob goes to the remote store alone. Files older than the blob TTL, and partial
files a killed writer left, are swept now and then; `remove_cluster_files` clears a cluster's folder when it
stops.

A blob freed by `recycle` (a round's updates once folded) keeps its file as a spare that the next writer writes
over: a fresh 45 MB file costs its pages anew, allocated and zeroed (26 ms a write here, against 9 over a spare),
and freeing them again costs more. Spares are few and short-lived (`SPARE_*`).
"""

from __future__ import annotations

import contextlib
import errno
import functools
import hashlib
import io
import logging
import os
import secrets
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path, PurePosixPath
from typing import Any, BinaryIO, cast

import redis

from fedqueue.config import LOOPBACK_HOSTS, Settings, broker_address, broker_on_this_host
from fedqueue.core.broker.blobs import BlobStore, blob_ref
from fedqueue.core.codec import BlobRef
from fedqueue.errors import BlobIntegrityError

log = logging.getLogger(__name__)

PARTIAL = ".partial"  # files being written; renamed out of here once whole
SPARE = ".spare"  # files of recycled blobs, for writers to write over
SPARE_MAX_BYTES = 1 << 30  # spares kept at most, and no more than a quarter of the folder's free room
SPARE_MAX_AGE_S = 60.0  # a spare no writer took for this long is let go
SWEEP_EVERY_S = 60.0  # one process sweeps old files at most this often
PARTIAL_MAX_AGE_S = 3600.0  # a partial file this old lost its writer
SAY_EVERY_S = 60.0  # "shared memory is full" is logged at most this often by one process
# No room for the file: the folder is full, or a quota or file-size limit refuses it.
NO_ROOM = {errno.ENOSPC, errno.EDQUOT, errno.ENOMEM, errno.EFBIG}

Writer = Callable[[BinaryIO], object]


class SharedMemoryBlobStore:
    """A `BlobStore` of files in a shared-memory folder, over `remote` (Redis or a shared folder)."""

    def __init__(self, root: Path, remote: BlobStore, *, one_host: bool | Callable[[], bool], ttl_s: int) -> None:
        self.root = root
        self.remote = remote
        # True: no process elsewhere reads these blobs, none is copied to `remote`. A callable is asked at the
        # first blob written (it may ask the broker, which need not be up when this is made), then kept.
        self._one_host = one_host
        self._ttl_s = ttl_s
        self._lock = threading.Lock()
        self._swept_at = time.monotonic()
        self._said_at: float | None = None

    def _folder(self, key: str) -> Path:
        parts = PurePosixPath(key).parts
        if not parts or key.startswith("/") or any(part in ("", ".", "..", PARTIAL) for part in parts):
            raise BlobIntegrityError(f"blob key {key!r} escapes the shared-memory folder")
        return self.root.joinpath(*parts)

    @property
    def one_host(self) -> bool:
        if not isinstance(self._one_host, bool):
            self._one_host = self._one_host()
        return self._one_host

    def write(self, key: str, write: Writer, *, named_by_content: bool = False) -> BlobRef:
        """A blob that `write` writes into a file object: straight into shared memory, no bytes in between.

        Named by a fresh tag, or (`named_by_content`: a version a checkpoint keeps, whose digest must say its
        content) by the sha256 taken as the bytes pass."""
        if self.one_host:
            hashed: list[_HashingWriter] = []

            def write_hashed(out: BinaryIO) -> None:
                hashed.append(_HashingWriter(out))
                write(cast(BinaryIO, hashed[-1]))

            tag = secrets.token_hex(32)

            def name() -> str:  # asked once the file is written
                return hashed[-1].sha256.hexdigest() if named_by_content else tag

            nbytes = self._keep(key, name, write_hashed if named_by_content else write)
            if nbytes is not None:
                return BlobRef(key=key, sha256=name(), nbytes=nbytes)
        buffer = io.BytesIO()
        write(buffer)
        return self.put(key, buffer.getvalue())

    def put(self, key: str, data: bytes) -> BlobRef:
        ref = blob_ref(key, data) if self.one_host else self.remote.put(key, data)
        if self._keep(key, ref.sha256, lambda out: out.write(data)) is None and self.one_host:
            return self.remote.put(key, data)
        return ref

    def put_many(self, items: Sequence[tuple[str, bytes]]) -> list[BlobRef]:
        return [self.put(key, data) for key, data in items]

    def _keep(self, key: str, digest: str | Callable[[], str], write: Writer) -> int | None:
        """Write the blob's file, named `digest` (or what it returns once the file is written); its size, or None
        where shared memory has no room for it."""
        partials = self.root / PARTIAL
        try:
            partials.mkdir(parents=True, exist_ok=True)
            partial = self._take_spare(partials) or _fresh_file(partials)
        except OSError as err:
            self._no_room(err)
            return None
        try:
            with partial.open("r+b") as out:
                write(out)
                nbytes = out.tell()
                out.truncate()  # a spare may have been longer
            self._publish(partial, key, digest if isinstance(digest, str) else digest())
        except OSError as err:
            partial.unlink(missing_ok=True)
            self._no_room(err)
            return None
        except BaseException:
            partial.unlink(missing_ok=True)
            raise
        self._maybe_sweep()
        return nbytes

    def _take_spare(self, partials: Path) -> Path | None:
        """A spare file, moved among the partial files for a writer to write over; None where there is none."""
        spares = self.root / SPARE
        try:
            names = os.listdir(spares)
        except OSError:
            return None
        for name in names:
            taken = partials / f"spare-{secrets.token_hex(8)}"
            try:
                os.rename(spares / name, taken)
            except FileNotFoundError:
                continue  # another writer took it first
            os.utime(taken)  # a partial file's age is its writer's: the sweep must not take this one for lost
            return taken
        return None

    def _publish(self, partial: Path, key: str, digest: str) -> None:
        folder = self._folder(key)
        for attempt in range(3):
            folder.mkdir(parents=True, exist_ok=True)
            try:
                os.replace(partial, folder / digest)
                return
            except FileNotFoundError:
                if attempt == 2:
                    raise
                # A delete of a neighbouring blob removed the emptied folder in between: make it again.

    def _no_room(self, err: OSError) -> None:
        """Raise `err` unless it says the folder has no room; say that now and then."""
        if err.errno not in NO_ROOM:
            raise err
        now = time.monotonic()
        with self._lock:
            if self._said_at is not None and now - self._said_at < SAY_EVERY_S:
                return
            self._said_at = now
        log.warning("shared memory %s is full (%s): blobs go to the broker meanwhile", self.root, err.strerror)

    def local_path(self, ref: BlobRef) -> Path | None:
        """The file of this blob in this host's shared memory, or None (elsewhere, or gone)."""
        path = self._folder(ref.key) / ref.sha256
        try:
            size = path.stat().st_size
        except OSError:
            return None
        return path if size == ref.nbytes else None

    def get(self, ref: BlobRef) -> bytes:
        return self.get_many([ref])[0]

    def get_many(self, refs: Sequence[BlobRef]) -> list[bytes]:
        found: list[bytes | None] = [self._read(ref) for ref in refs]
        elsewhere = [ref for ref, data in zip(refs, found, strict=True) if data is None]
        fetched = iter(self.remote.get_many(elsewhere))
        return [data if data is not None else next(fetched) for data in found]

    def _read(self, ref: BlobRef) -> bytes | None:
        path = self.local_path(ref)
        if path is None:
            return None
        try:
            return path.read_bytes()
        except FileNotFoundError:  # deleted since
            return None

    def delete(self, keys: Iterable[str]) -> None:
        names = list(keys)
        for key in names:
            folder = self._folder(key)
            shutil.rmtree(folder, ignore_errors=True)
            self._prune(folder.parent)
        self.remote.delete(names)  # where a blob went when shared memory was full, or a copy for other hosts

    def recycle(self, keys: Iterable[str]) -> None:
        """Delete these blobs, keeping their files as spares for writers to write over.

        A reader that still maps one of them sees it change under it: only for blobs whose readers are done,
        or are refused what they made from them (a round's updates once the round is closed: an aggregator
        that lost its claim publishes nothing)."""
        names = list(keys)
        spares = self.root / SPARE
        room = self._spare_room(spares)
        for key in names:
            try:
                files = list(self._folder(key).iterdir())
            except OSError:
                continue
            for file in files:
                try:
                    size = file.stat().st_size
                    if size > room:
                        break
                    spares.mkdir(exist_ok=True)
                    os.rename(file, spares / secrets.token_hex(8))
                except OSError:
                    continue  # gone meanwhile: delete below makes sure
                room -= size
        self.delete(names)

    def _spare_room(self, spares: Path) -> int:
        """How many bytes more the spares may hold."""
        try:
            free = os.statvfs(self.root)
        except OSError:
            return 0
        try:
            held = sum(entry.stat().st_size for entry in os.scandir(spares))
        except OSError:
            held = 0  # none yet (or taken meanwhile)
        return max(0, min(SPARE_MAX_BYTES, free.f_bavail * free.f_frsize // 4) - held)

    def _prune(self, folder: Path) -> None:
        """Empty folders up the key's path go too (a key's folder per device and round would pile up)."""
        while folder != self.root and self.root in folder.parents:
            try:
                folder.rmdir()
            except OSError:
                return
            folder = folder.parent

    def exists(self, key: str) -> bool:
        try:
            with os.scandir(self._folder(key)) as entries:
                if any(True for _ in entries):
                    return True
        except OSError:
            pass
        return self.remote.exists(key)

    def _maybe_sweep(self) -> None:
        now = time.monotonic()
        with self._lock:
            if now - self._swept_at < SWEEP_EVERY_S:
                return
            self._swept_at = now
        self.sweep()

    def sweep(self, now: float | None = None) -> int:
        """Remove blob files past the blob TTL and partial files a killed writer left; how many went."""
        now = time.time() if now is None else now
        removed = 0
        for folder, _, files in os.walk(self.root, topdown=False):
            here = Path(folder)
            max_age = {PARTIAL: PARTIAL_MAX_AGE_S, SPARE: SPARE_MAX_AGE_S}.get(here.name, self._ttl_s)
            for name in files:
                path = here / name
                try:
                    found = path.stat()
                    # A spare's age runs from when it was freed (the rename), a blob's from its writing.
                    if now - (found.st_ctime if here.name == SPARE else found.st_mtime) > max_age:
                        path.unlink()
                        removed += 1
                except OSError:
                    continue  # gone meanwhile
            if here != self.root and here.name not in (PARTIAL, SPARE):
                with contextlib.suppress(OSError):  # not empty
                    here.rmdir()
        return removed


class _HashingWriter(io.RawIOBase):
    """A file object that writes to `out` and takes the sha256 of what passes through it."""

    def __init__(self, out: BinaryIO) -> None:
        super().__init__()
        self._out = out
        self.sha256 = hashlib.sha256()

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        self.sha256.update(data)
        return self._out.write(data)


def _fresh_file(partials: Path) -> Path:
    fd, name = tempfile.mkstemp(dir=partials)
    os.close(fd)
    return Path(name)


def shm_base(settings: Settings) -> Path | None:
    """The shared-memory folder blobs go in, or None where they skip it (off, or no folder this user writes)."""
    if settings.blob_shm == "off":
        return None
    base = Path(settings.blob_shm_dir)
    if not base.is_dir() or not os.access(base, os.W_OK | os.X_OK):
        return None
    return base


def shm_root(settings: Settings) -> Path | None:
    """This cluster's folder in shared memory (per user, broker and key prefix), or None where blobs skip it."""
    base = shm_base(settings)
    if base is None or not settings.broker_url:
        return None
    # Named by the broker as every process reaches it, whatever the credentials or loopback name in its URL.
    cluster = hashlib.sha256(f"{broker_address(settings.broker_url)}\n{settings.key_prefix}".encode()).hexdigest()[:16]
    return base / f"fedqueue-{os.getuid()}" / cluster


def listens_on_loopback_only(client: redis.Redis) -> bool:
    """Whether the Redis server takes connections from this host alone: a unix socket, or loopback binds only.

    A broker reached here by a loopback URL may still listen on an address other hosts' workers use, and those
    read blobs from it. Where the server will not say (CONFIG refused, as managed services do), other hosts may.
    """
    try:
        port = client.config_get("port").get("port")
        binds = str(client.config_get("bind").get("bind", "")).split()
    except redis.ResponseError:
        return False
    if port == "0":
        return True
    # An empty bind listens on every interface; a leading "-" marks an address that may be missing.
    return bool(binds) and all(_loopback(address.lstrip("-")) for address in binds)


def _loopback(address: str) -> bool:
    return address in LOOPBACK_HOSTS or address.startswith("127.")  # all of 127.0.0.0/8 is loopback


def with_shared_memory(settings: Settings, remote: BlobStore, client: redis.Redis | None = None) -> BlobStore:
    """`remote` behind this host's shared memory, as the settings ask (see `Settings.blob_shm`).

    `client` is the broker's: under `auto`, blobs stay on this host only when the broker is reached by a loopback
    URL and listens on loopback alone."""
    root = shm_root(settings)
    if root is None:
        return remote
    try:
        root.parent.mkdir(mode=0o700, exist_ok=True)
        root.mkdir(mode=0o700, exist_ok=True)
    except OSError as err:
        log.warning("blobs go to the broker: shared-memory folder %s cannot be made (%s)", root, err.strerror)
        return remote
    if root.parent.stat().st_uid != os.getuid():
        # Another user's folder could hand us blobs of their making.
        log.warning("blobs go to the broker: shared-memory folder %s is not this user's", root.parent)
        return remote
    mode = settings.blob_shm
    one_host: bool | Callable[[], bool] = mode == "local"
    if mode == "auto" and broker_on_this_host(settings.broker_url or ""):
        one_host = True if client is None else functools.partial(listens_on_loopback_only, client)
    return SharedMemoryBlobStore(root, remote, one_host=one_host, ttl_s=settings.blob_ttl_s)


def remove_cluster_files(settings: Settings) -> None:
    """A stopped cluster's blob files (its broker's blobs go with it)."""
    root = shm_root(settings)
    if root is not None:
        shutil.rmtree(root, ignore_errors=True)
