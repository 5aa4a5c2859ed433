"""Tensor files read safely (docs/method.md §9.5): pickles refused (loading one can run code), safetensors files
checked (header, every tensor's bytes present, names and shapes as the config implies, finite values) before
anything uses them; every error a ``ValueError`` naming the file."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file
from torch import Tensor

from ..errors import UserError

PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle")


def is_pickle(path: Path) -> bool:
    """Whether ``path`` is a pickle: ``torch.save``'s zip archive or a bare pickle stream (protocol >= 2)."""
    with open(path, "rb") as f:
        head = f.read(9)
    if head[8:9] == b"{":  # safetensors: an 8-byte header length, then the JSON header
        return False
    return head.startswith(b"PK\x03\x04") or (head[:1] == b"\x80" and head[1:2] in (b"\x02", b"\x03", b"\x04", b"\x05"))


def refuse_pickle(path: Path) -> None:
    """Pickles can run code when loaded; setdlm never unpickles one (checkpoints are safetensors)."""
    if is_pickle(path):
        raise UserError(f"{path}: is a pickle file (torch.save / .bin / .pt), not safetensors; setdlm does not "
                        "load pickles, since loading one can run code. Convert it to safetensors where you trust it")


def check_safetensors(path: Path) -> None:
    """A ``ValueError`` naming ``path`` unless it is a complete safetensors file (header read, every tensor's
    bytes present): checks weights that another library (``transformers``) will load, before it does."""
    refuse_pickle(path)
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            n = int.from_bytes(f.read(8), "little")
            header = json.loads(f.read(n)) if 8 + n <= size else None
        if header is None:
            raise UserError("header runs past the end of the file")
        end = max((v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"), default=0)
        if 8 + n + end > size:
            raise UserError(f"{size} bytes, but the header needs {8 + n + end}")
        with safe_open(str(path), "pt"):
            pass
    except Exception as e:  # json / safetensors raise their own error types
        raise UserError(f"{path}: corrupt or truncated safetensors file ({str(e).splitlines()[0]})") from None


def read_tensors(path: Path, expected: dict[str, tuple] | None = None, what: str = "") -> dict[str, Tensor]:
    """Load a safetensors file; check names and shapes against ``expected`` and that values are finite."""
    if not path.is_file():
        raise UserError(f"{path}: missing{what}")
    refuse_pickle(path)
    try:
        sd = load_file(str(path))
    except Exception as e:  # safetensors raises its own error type on a bad header / short file
        raise UserError(f"{path}: corrupt or truncated safetensors file ({str(e).splitlines()[0]})") from None
    if expected is not None:
        missing = [k for k in expected if k not in sd]
        extra = [k for k in sd if k not in expected]
        if missing or extra:
            raise UserError(f"{path}: tensors do not match config.json (missing {missing[:3]}, unexpected "
                            f"{extra[:3]})")
        for k, shape in expected.items():
            if tuple(sd[k].shape) != shape:
                raise UserError(f"{path}: tensor {k!r} has shape {tuple(sd[k].shape)} but config.json implies {shape}")
    for k, v in sd.items():
        if v.is_floating_point() and not torch.isfinite(v).all():
            raise UserError(f"{path}: tensor {k!r} holds non-finite values (corrupt file?)")
    return sd
