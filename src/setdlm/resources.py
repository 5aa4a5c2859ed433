"""What the machine can do, checked before any work starts (docs/errors.md).

* :func:`resolve_device` — ``"auto"``, ``"cpu"``, ``"cuda"``, ``"cuda:N"`` → a ``torch.device``, or a one-line
  ``ValueError`` when CUDA (or device ``N``) is not there.
* :func:`memory_bytes` — the memory a device offers: the GPU's total memory, or for the CPU the physical
  memory capped by the process's cgroup limit.
* :func:`check_fits` — refuse a job whose *lower-bound* estimate already exceeds that memory, so that
  ``--hidden-size 1000000`` or ``--batch-size 100000000`` stops at once instead of swapping for hours.
  Estimates are lower bounds: a job refused here cannot fit; one accepted may still run out of memory.
* :func:`native_bf16` — whether bf16 matmuls run natively (CUDA, or a CPU with AVX512-BF16 / AMX). On a CPU
  without them PyTorch emulates bf16 and training gets *slower*, not faster (docs/training.md).
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from .errors import UserError


def resolve_device(spec: str | torch.device | None, local_rank: int = 0) -> torch.device:
    """``spec`` (``None``/``"auto"``: CUDA when available, else CPU) as a usable ``torch.device``."""
    if spec is None or spec == "auto":
        return torch.device(f"cuda:{local_rank}" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(f"cuda:{local_rank}" if spec == "cuda" else spec)
    except (RuntimeError, TypeError):
        raise UserError(f"unknown device {spec!r}; use auto, cpu, cuda or cuda:N") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise UserError(f"device {str(spec)!r}: CUDA is not available on this machine (this torch build or "
                            "driver sees no GPU); use device cpu", fields=("device",))
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise UserError(f"device {str(spec)!r}: only {torch.cuda.device_count()} CUDA device(s) are visible")
    elif dev.type not in ("cpu", "mps"):
        raise UserError(f"unsupported device {str(spec)!r}; use auto, cpu, cuda or cuda:N")
    return dev


def _cgroup_limit() -> int | None:
    for f in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            text = Path(f).read_text().strip()
        except OSError:
            continue
        if text.isdigit():
            return int(text)
    return None


def memory_bytes(device: torch.device) -> int:
    """Total memory of ``device`` in bytes (CPU: physical memory, capped by a cgroup limit)."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    limit = _cgroup_limit()
    return min(total, limit) if limit else total


def _gib(n: float) -> str:
    return f"{n / 2**30:,.1f} GiB"


def check_fits(what: str, needed: float, device: torch.device, hint: str, fields: tuple[str, ...] = ()) -> None:
    """A ``ValueError`` when the lower-bound estimate ``needed`` (bytes) exceeds the device's memory;
    ``fields``: the argument names the message uses (:class:`~setdlm.errors.UserError`)."""
    have = memory_bytes(device)
    if needed > have:
        raise UserError(f"{what} needs at least {_gib(needed)} but {device.type} memory is {_gib(have)}; {hint}",
                        fields=fields)


def native_bf16(device: torch.device) -> bool:
    """Whether bf16 matmuls run natively on ``device`` (CUDA; a CPU with AVX512-BF16 or AMX-BF16)."""
    if device.type == "cuda":
        return True
    if device.type != "cpu":
        return False
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:  # not Linux: trust PyTorch's own dispatch level
        return torch.backends.cpu.get_cpu_capability() in ("AVX512_BF16", "AMX")
    return "avx512_bf16" in flags or "amx_bf16" in flags
