"""Folders written atomically (docs/method.md §9.5): a folder is first written under a hidden temporary name next
to its destination and then renamed, so a crash (even SIGKILL) leaves either the previous folder or the new one,
never half of one; the temporary folder such a crash leaves is removed by the next write to that destination
(:func:`remove_partial`)."""

from __future__ import annotations

import os
import re
import shutil
import socket
import tempfile
from pathlib import Path

from ..errors import UserError
from ..outputs import umask
from .layout import is_checkpoint


def _fsync_tree(folder: Path) -> None:
    for p in folder.rglob("*"):
        if p.is_file():
            with open(p, "rb") as f:
                os.fsync(f.fileno())


def partial_folder(dst: Path, tag: str) -> Path:
    """The name of a temporary folder that becomes ``dst`` once complete: hidden, next to it, naming this
    host and process (``.NAME.TAG-HOST-PID``), so that :func:`remove_partial` knows when its writer is gone."""
    return dst.with_name(f".{dst.name}.{tag}-{socket.gethostname()}-{os.getpid()}")


def remove_partial(dst: Path) -> None:
    """Remove the temporary folders of writes into ``dst`` whose process was killed halfway (SIGKILL, power
    loss): never a checkpoint (a complete one is renamed into place), and never the folder of a process
    still running on this host, or of another host."""
    host = socket.gethostname()
    for tmp in [*dst.parent.glob(f".{dst.name}.*"), *dst.parent.glob(f"..{dst.name}.*")]:
        m = re.fullmatch(rf"\.?\.{re.escape(dst.name)}\.[a-z]+-{re.escape(host)}-(\d+)(?:-.*|\.tmp-.*)?", tmp.name)
        if m is not None and not _alive(int(m.group(1))):
            shutil.rmtree(tmp, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def _commit_dir(tmp: Path, dst: Path, replaceable=is_checkpoint) -> None:
    """Move the finished folder ``tmp`` to ``dst``; an existing folder at ``dst`` that ``replaceable`` accepts (a
    checkpoint) is replaced."""
    if dst.exists():
        if not replaceable(dst):
            raise UserError(f"refusing to overwrite {str(dst)!r}: it exists and is not a setdlm checkpoint")
        old = dst.with_name(f".{dst.name}.old-{os.getpid()}")
        os.replace(dst, old)
        os.replace(tmp, dst)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, dst)


def write_folder(dst: Path, fill, replaceable=is_checkpoint) -> Path:
    """Write the folder ``dst`` atomically (the module docstring): ``fill(tmp)`` writes its files into a temporary
    folder next to ``dst``, which then replaces it (only a folder ``replaceable`` accepts, by default a setdlm
    checkpoint, is ever replaced); on an error nothing of it is kept."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    remove_partial(dst)  # what a save killed halfway left
    tmp = Path(tempfile.mkdtemp(dir=dst.parent, prefix=f"{partial_folder(dst, 'tmp').name}-"))
    try:
        mask = umask()
        tmp.chmod(0o777 & ~mask)  # an ordinary folder's permissions, not mkdtemp's 0700
        fill(tmp)
        for f in tmp.rglob("*"):  # safetensors writes 0600: an ordinary file's permissions instead
            f.chmod((0o777 if f.is_dir() else 0o666) & ~mask)
        _fsync_tree(tmp)
        _commit_dir(tmp, dst, replaceable)
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(e, OSError) or type(e).__name__ == "SafetensorError":  # disk full, read-only, ...
            raise UserError(f"{dst}: cannot write the checkpoint ({str(e).splitlines()[0]}); nothing of it was "
                            "kept, an earlier checkpoint there is intact") from None
        raise
    return dst
