"""Seeds derived from a tuple of parts, identical in every process: the trainer's data order and step
noise, and the likelihood bound's per-batch orders and masks (docs/evaluation.md) draw from them."""

from __future__ import annotations

import hashlib


def derive_seed(*parts) -> int:
    """A 63-bit seed from any tuple of ints/strings, identical in every process."""
    return int.from_bytes(hashlib.sha256(repr(parts).encode()).digest()[:8], "little") & (2**63 - 1)
