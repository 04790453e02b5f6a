"""Model weights as bytes: safetensors, so a blob never carries code (unlike a pickle).

Through a blob store that keeps files in this host's shared memory, a state is written straight from its
tensors into the file and read back as tensors over a private mapping of it: no bytes object in between,
no copy on read. Elsewhere it is encoded to bytes and decoded from them; the format is the same.
"""

from __future__ import annotations

import json
import mmap
import struct
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

from fedqueue.core.broker.blobs import BlobStore
from fedqueue.core.broker.shm import SharedMemoryBlobStore
from fedqueue.core.codec import BlobRef

if TYPE_CHECKING:
    import torch

HEADER_ALIGN = 8  # safetensors pads its JSON header so that the data starts 8-aligned


def encode_state(state: dict[str, torch.Tensor]) -> bytes:
    from safetensors.torch import save

    return save({name: tensor.contiguous() for name, tensor in state.items()})


def decode_state(data: bytes) -> dict[str, torch.Tensor]:
    from safetensors.torch import load

    return load(data)


def write_state(state: dict[str, torch.Tensor], out: BinaryIO) -> None:
    """The safetensors encoding of `state`, written tensor by tensor into `out` (no whole-state buffer)."""
    import torch

    tensors = {name: tensor.detach().to("cpu").contiguous() for name, tensor in state.items()}
    # Widest elements first: every tensor then starts aligned to its element size (read back in place).
    order = sorted(tensors, key=lambda name: (-tensors[name].element_size(), name))
    header: dict[str, dict[str, object]] = {}
    offset = 0
    for name in order:
        tensor = tensors[name]
        nbytes = tensor.numel() * tensor.element_size()
        header[name] = {"dtype": _dtype_name(tensor.dtype), "shape": list(tensor.shape), "data_offsets": []}
        header[name]["data_offsets"] = [offset, offset + nbytes]
        offset += nbytes
    text = json.dumps({name: header[name] for name in tensors}, separators=(",", ":")).encode()
    text += b" " * (-len(text) % HEADER_ALIGN)
    out.write(struct.pack("<Q", len(text)))
    out.write(text)
    for name in order:
        tensor = tensors[name]
        if tensor.numel():
            out.write(tensor.reshape(-1).view(torch.uint8).numpy().data)


def map_state(path: Path) -> dict[str, torch.Tensor]:
    """A safetensors file's tensors over a private (copy-on-write) mapping: read in place, never written back."""
    import torch
    from safetensors.torch import _TYPES

    with path.open("rb") as file:
        mapped = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_COPY)
    (length,) = struct.unpack_from("<Q", mapped, 0)
    header = json.loads(mapped[8 : 8 + length])
    header.pop("__metadata__", None)
    start = 8 + length
    state: dict[str, torch.Tensor] = {}
    # In the order of the data, as safetensors' own decoding gives them.
    for name, entry in sorted(header.items(), key=lambda item: item[1]["data_offsets"][0]):
        dtype = _TYPES.get(entry["dtype"])
        if dtype is None:
            raise ValueError(f"weights: {path.name} holds an unknown dtype {entry['dtype']!r}")
        begin, end = entry["data_offsets"]
        if end == begin:
            state[name] = torch.empty(entry["shape"], dtype=dtype)
            continue
        flat = torch.frombuffer(mapped, dtype=torch.uint8, count=end - begin, offset=start + begin)
        state[name] = flat.view(dtype).reshape(entry["shape"])
    return state


def _dtype_name(dtype: torch.dtype) -> str:
    from safetensors.torch import _TYPES

    for name, known in _TYPES.items():
        if known == dtype:
            return name
    raise ValueError(f"weights: dtype {dtype} has no safetensors name")


def put_state(blobs: BlobStore, key: str, state: dict[str, torch.Tensor]) -> BlobRef:
    """Store a state as a blob: straight into shared memory where the store keeps files there."""
    if isinstance(blobs, SharedMemoryBlobStore):
        return blobs.write(key, lambda out: write_state(state, out))
    return blobs.put(key, encode_state(state))


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
