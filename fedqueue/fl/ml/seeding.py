"""Per-task seeds that every process derives identically, without shared state."""

from __future__ import annotations

import hashlib
import operator

# Keeps these seeds apart from any other blake2b use of the same three ints.
_PERSON = b"fedqueue-task"


def task_seed(run_seed: int, round_index: int, device: int) -> int:
    """A 63-bit seed fixed by (run_seed, round_index, device).

    Python's hash() is salted per process, so the seed comes from blake2b over a
    fixed-width encoding of the three ints instead.
    """
    payload = b"".join(
        operator.index(value).to_bytes(16, "little", signed=True) for value in (run_seed, round_index, device)
    )
    digest = hashlib.blake2b(payload, digest_size=8, person=_PERSON).digest()
    # 63 bits: fits torch.Generator.manual_seed and numpy seeds as a non-negative int64.
    return int.from_bytes(digest, "little") >> 1
