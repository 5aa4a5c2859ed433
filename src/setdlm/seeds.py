"""Seeds derived from a tuple of parts, identical in every process: the trainer's data order and step
noise, and the likelihood bound's per-batch orders and masks (docs/evaluation.md) draw from them; and the
check of a seed given by a user (decoding's ``seed=``), against the range ``torch.Generator`` accepts."""

from __future__ import annotations

import hashlib

from .errors import UserError


def derive_seed(*parts) -> int:
    """A 63-bit seed from any tuple of ints/strings, identical in every process."""
    return int.from_bytes(hashlib.sha256(repr(parts).encode()).digest()[:8], "little") & (2**63 - 1)


SEED_RANGE = (-(2**63), 2**64 - 1)  # what torch.Generator.manual_seed accepts


def check_seed(seed, name: str = "seed") -> int:
    """``seed`` as a seed torch accepts: an int (a bool is a ``TypeError``) in :data:`SEED_RANGE` (else a
    ``ValueError``), each naming ``name``."""
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"{name} must be an integer, got {type(seed).__name__} {seed!r}")
    if not SEED_RANGE[0] <= seed <= SEED_RANGE[1]:
        raise UserError(f"{name} must lie in [-2**63, 2**64 - 1] (torch's seeds), got {seed}")
    return seed
