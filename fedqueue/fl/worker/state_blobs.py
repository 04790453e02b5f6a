"""Model states through the blob store: written into and mapped from this host's shared memory where the store
keeps files there (fl/ml/weights.py's write_state and map_state), encoded and decoded elsewhere."""

from __future__ import annotations

import contextlib
import mmap
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from fedqueue.core.broker.blobs import BlobStore
from fedqueue.core.broker.shm import SharedMemoryBlobStore
from fedqueue.core.codec import BlobRef
from fedqueue.fl.ml.weights import decode_state, encode_state, map_state, write_state

if TYPE_CHECKING:
    import torch

Buffer = bytes | memoryview  # a state's bytes, read only: encoded, or a map of its file


def put_state(blobs: BlobStore, key: str, state: dict[str, torch.Tensor]) -> BlobRef:
    """Store a state as a blob: straight into shared memory where the store keeps files there."""
    if isinstance(blobs, SharedMemoryBlobStore):
        return blobs.write(key, lambda out: write_state(state, out))
    return blobs.put(key, encode_state(state))


def publish_state(blobs: BlobStore, key: str, state: dict[str, torch.Tensor]) -> tuple[BlobRef, Buffer]:
    """Store a state as a blob named by its sha256 (a version a checkpoint keeps); its ref and its bytes as
    stored: a read-only map of its file where it went straight into shared memory (no encoding in between),
    else its encoding."""
    if isinstance(blobs, SharedMemoryBlobStore):
        ref = blobs.write(key, lambda out: write_state(state, out), named_by_content=True)
        path = blobs.local_path(ref)
        if path is not None:
            # Deleted since (a second publisher's rename does not, it keeps the same bytes): encoded below.
            with contextlib.suppress(FileNotFoundError), path.open("rb") as file:
                return ref, _whole_map(file.fileno())
        return ref, encode_state(state)
    encoded = encode_state(state)
    return blobs.put(key, encoded), encoded


def _whole_map(fileno: int) -> memoryview:
    """A read-only map of a whole file, its pages mapped at once: a checkpoint then writes the 45 MB from it
    in half the time it takes when each page faults in as the write reaches it."""
    flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)  # Linux only
    return memoryview(mmap.mmap(fileno, 0, flags=flags, prot=mmap.PROT_READ)).toreadonly()


def put_states(blobs: BlobStore, items: Sequence[tuple[str, dict[str, torch.Tensor]]]) -> list[BlobRef]:
    """Several states (a pack's updates): one round trip where they go to Redis."""
    if isinstance(blobs, SharedMemoryBlobStore):
        return [put_state(blobs, key, state) for key, state in items]
    return blobs.put_many([(key, encode_state(state)) for key, state in items])


def get_state(blobs: BlobStore, ref: BlobRef) -> dict[str, torch.Tensor]:
    state = _mapped(blobs, ref)
    return state if state is not None else decode_state(blobs.get(ref))


def get_states(blobs: BlobStore, refs: Sequence[BlobRef]) -> list[dict[str, torch.Tensor]]:
    """The states of these blobs: mapped from this host's shared memory where they are there, else read
    (several per round trip) and decoded."""
    mapped: list[dict[str, torch.Tensor] | None] = [_mapped(blobs, ref) for ref in refs]
    elsewhere = [ref for ref, state in zip(refs, mapped, strict=True) if state is None]
    read = iter(blobs.get_many(elsewhere))
    return [state if state is not None else decode_state(next(read)) for state in mapped]


def recycle_states(blobs: BlobStore, keys: Iterable[str]) -> None:
    """Free states that no reader uses again, or whose readers are refused what they make from them (a closed
    round's updates): their files in shared memory are written over by the next states (see `recycle`)."""
    if isinstance(blobs, SharedMemoryBlobStore):
        blobs.recycle(keys)
    else:
        blobs.delete(keys)


def _mapped(blobs: BlobStore, ref: BlobRef) -> dict[str, torch.Tensor] | None:
    if not isinstance(blobs, SharedMemoryBlobStore):
        return None
    path = blobs.local_path(ref)
    if path is None:
        return None
    try:
        return map_state(path)
    except FileNotFoundError:  # deleted since
        return None
