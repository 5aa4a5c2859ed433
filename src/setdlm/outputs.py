"""Output paths, checked before any work and written without losing a result (docs/errors.md).

``setdlm generate --output``, ``eval --output`` / ``--predictions`` and ``bench --out`` may compute for
minutes; :func:`check_file` and :func:`check_folder` refuse a path that cannot be written *before* that
(a folder where a file is expected, a file in the way of a folder, a parent that is not writable), and
:func:`write_text` turns a write that fails anyway (disk full, read-only file system) into a one-line
``UserError`` naming the path. ``name``: the argument the path was given as (``output``, ``out``), which the
command line spells as its flag.

What the path names is honoured, never replaced: a symlink is written through (its target replaced
atomically, the link kept), and a FIFO, a terminal, a device node or ``/dev/stdout`` / ``/dev/fd/N`` is
written to as a stream (appended, so a shell's ``> log`` redirect is not truncated), never replaced by a
regular file.
"""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path

from .errors import UserError

STREAM_ROOTS = ("/dev/", "/proc/")  # /dev/stdout, /dev/fd/N, /proc/self/fd/N: an open stream, not a file
FULL_DEVICES = {(1, 7)}  # (major, minor) of Linux's /dev/full, which fails every write with "no space left"


def is_stream(path: str | Path) -> bool:
    """Is ``path`` a stream to write into rather than a file to replace: something that exists and is not a
    regular file or folder (FIFO, terminal, device node, socket), or a path under /dev or /proc?"""
    p = Path(path)
    try:
        mode = os.stat(p).st_mode  # follows symlinks
    except OSError:
        return False
    if stat.S_ISDIR(mode):
        return False
    return not stat.S_ISREG(mode) or any(str(q).startswith(STREAM_ROOTS) for q in (p.absolute(), p.resolve()))


def _target(p: Path) -> Path:
    """The file a write to ``p`` replaces: ``p``, or the end of its symlink chain (the link is kept)."""
    return p.resolve() if p.is_symlink() else p


def _existing_parent(p: Path) -> Path:
    """The nearest ancestor of ``p`` that exists (the folder that new parents would be created in)."""
    parent = p.absolute().parent
    while not parent.exists():
        parent = parent.parent
    return parent


def _check_creatable(p: Path, name: str) -> None:
    parent = _existing_parent(p)
    if not parent.is_dir():
        raise UserError(f"{name} {str(p)!r}: {str(parent)!r} is a file, so nothing can be created below it",
                        fields=(name,))
    if not os.access(parent, os.W_OK | os.X_OK):
        raise UserError(f"{name} {str(p)!r}: folder {str(parent)!r} is not writable", fields=(name,))


def check_file(path: str | Path, name: str = "output") -> Path:
    """``path`` as a file that can be written: not a folder, under a folder that exists or can be created."""
    p = Path(path)
    if p.is_dir():
        raise UserError(f"{name} {str(p)!r} is a folder; name a file", fields=(name,))
    if is_stream(p):
        if not os.access(p, os.W_OK):
            raise UserError(f"{name} {str(p)!r}: not writable", fields=(name,))
        st = os.stat(p)
        if stat.S_ISCHR(st.st_mode) and (os.major(st.st_rdev), os.minor(st.st_rdev)) in FULL_DEVICES:
            raise UserError(f"{name} {str(p)!r}: cannot write (the device is always full)", fields=(name,))
        return p
    p = _target(p)
    if p.exists() and not os.access(p.parent, os.W_OK | os.X_OK):
        raise UserError(f"{name} {str(p)!r}: folder {str(p.parent)!r} is not writable", fields=(name,))
    if not p.exists():
        _check_creatable(p, name)
    if os.statvfs(_existing_parent(p)).f_bavail == 0:  # a full file system: the write would fail at the end
        raise UserError(f"{name} {str(p)!r}: cannot write (no space left on its file system)", fields=(name,))
    return p


def check_folder(path: str | Path, name: str = "out") -> Path:
    """``path`` as a folder to write files into: an existing writable folder, or one that can be created."""
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise UserError(f"{name} {str(p)!r} exists and is not a folder", fields=(name,))
    if p.is_dir():
        if not os.access(p, os.W_OK | os.X_OK):
            raise UserError(f"{name} {str(p)!r}: folder is not writable", fields=(name,))
    else:
        _check_creatable(p, name)
    return p


def write_text(path: str | Path, text: str, name: str = "output") -> Path:
    """Write ``text`` atomically (its parents created), through a symlink, or into a stream (module
    docstring); an ``OSError`` becomes a one-line ``ValueError``."""
    p = Path(path)
    try:
        if is_stream(p):
            with open(p, "a", encoding="utf-8") as f:
                f.write(text)
            return p
        target = _target(p)
        target.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(target, text)
    except OSError as e:
        raise UserError(f"{name} {str(p)!r}: cannot write ({e.strerror or e})", fields=(name,)) from None
    return p


def umask() -> int:
    """The process's file-mode creation mask (read by setting it and putting it back)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def write_text_atomic(path: Path, text: str) -> None:
    """Write ``text`` to a temporary file beside ``path``, flush it to disk, then rename it over ``path``.
    The file gets the permissions of an ordinary new file (0666 less the umask), not ``mkstemp``'s 0600."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o666 & ~umask())
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
