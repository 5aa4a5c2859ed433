"""The run folder's bookkeeping (docs/training.md, "Resume after a crash"): the OS lock a training process
holds on it, which folders a run may write into, the metrics log (truncated to the checkpoint on resume),
the configuration a resumed run continues with, and what a Ctrl-C leaves behind.

A run folder holds ``checkpoints/step-NNNNNNNN`` (the last ``keep``), ``latest`` naming the newest,
``metrics.jsonl`` and ``.lock``."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import time
from pathlib import Path
from typing import TextIO

from ..errors import UserError
from ..formats import checkpoint as ckpt
from ..formats import layout
from ..outputs import write_text_atomic
from .config import TrainConfig, config_fields

METRICS = "metrics.jsonl"


class RunLock:
    """An OS lock (``flock``) on ``RUN/.lock``, held while a process trains into the run folder: a second
    process training into the same ``--out`` is refused at start, naming the holder. The kernel releases
    the lock when its holder dies, even by SIGKILL, so a stale lock never blocks a resume."""

    def __init__(self, out: Path):
        self.path = Path(out) / ".lock"
        self.file: TextIO | None = None  # open while the lock is held

    def acquire(self, sign: bool = True) -> None:
        """Take the lock; ``sign``: write this process into the file (once the run really starts)."""
        import fcntl  # POSIX only: needed when a run takes its lock, not to import this module

        if self.file is not None:
            if sign:
                self._sign(socket.gethostname())
            return
        f = open(self.path, "a+", encoding="utf-8")
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            f.seek(0)
            holder = f.read().strip() or "another process"
            f.close()
            raise UserError(f"{self.path.parent}: another training run is writing into this folder ({holder}); "
                            "wait for it to end or choose another out", fields=("out",)) from None
        self.file = f
        if sign:
            self._sign(socket.gethostname())

    def _sign(self, host: str) -> None:
        f = self.file
        assert f is not None  # acquire signs once it holds the lock
        f.seek(0)
        f.truncate()
        f.write(f"pid {os.getpid()} on {host}, since {time.strftime('%Y-%m-%d %H:%M:%S')}\n")
        f.flush()

    def check(self) -> None:
        """Refuse early (before reading the data) when the folder exists and is locked; the lock is held from
        here on, but the file is left as it is until the run starts (a refused run changes nothing)."""
        if self.path.is_file():
            self.acquire(sign=False)

    def release(self) -> None:
        if self.file is not None:
            self.file.close()  # closing the descriptor drops the flock
            self.file = None


def remove_if_unused(out: Path, fresh: list[Path]) -> None:
    """After a run that stopped before writing anything (refused, or failed while starting): remove the
    lock file and the folder it created (``fresh``), so that a refused ``--out`` is left exactly as it was."""
    if not out.is_dir() or any(p.name != ".lock" for p in out.iterdir()):
        return
    for p in fresh[::-1]:  # the lock file first, then the folder
        with contextlib.suppress(OSError):
            p.unlink() if p.name == ".lock" else p.rmdir()


def check_out_dir(cfg: TrainConfig) -> Path | None:
    """The checkpoint to resume from (or None); refuses to mix a new run into an old run folder, a checkpoint
    folder or a folder inside another run."""
    out, resume = Path(cfg.out), cfg.checkpointing.resume
    if out.exists() and not out.is_dir():
        raise UserError(f"out {cfg.out!r} exists and is not a folder")
    if layout.is_checkpoint(out):
        raise UserError(f"out {cfg.out!r} is a checkpoint folder, not a run folder; choose another out",
                        fields=("out",))
    for parent in out.absolute().parents:
        if (parent / layout.LATEST).is_file() and (parent / "checkpoints").is_dir():
            raise UserError(f"out {cfg.out!r} lies inside the training run {str(parent)!r}; choose a folder "
                            "outside it", fields=("out",))
    latest = layout.latest_checkpoint(out) if out.is_dir() else None
    if latest is None and out.is_dir() and any((out / "checkpoints").glob("step-*")):
        raise UserError(f"{out / layout.LATEST}: missing, but {out} holds checkpoints; repair or remove it")
    if latest is not None and not resume:
        raise UserError(f"out {cfg.out!r} already holds a training run; pass resume=True or choose another folder",
                        fields=("out", "resume"))
    log = out / METRICS
    if log.is_file():
        rows = read_log(log)
        if rows and latest is None and not resume:  # never truncate the log of another run
            raise UserError(f"{log}: holds {len(rows)} rows of another run (no checkpoint yet); pass resume=True "
                            "to restart that run, or choose another out", fields=("out", "resume"))
    return latest


def check_resumable(saved: dict, cfg: TrainConfig, where: Path) -> None:
    """Refuse to resume with a field other than the checkpoint's, except those of ``TrainConfig.RESUMABLE``
    (a field the checkpoint does not record, added after it was written, is not compared)."""
    now = cfg.to_dict()
    for f in config_fields():
        if f.name in TrainConfig.RESUMABLE or f.name not in saved:
            continue
        if saved[f.name] != now[f.name]:
            raise UserError(f"cannot resume: {f.name}={now[f.name]!r} but the checkpoint {where} was "
                             f"trained with {f.name}={saved[f.name]!r}")


def resume_config(out: str | Path, **given) -> TrainConfig:
    """The configuration of the run in ``out``: its latest checkpoint's training arguments, with the
    arguments the user actually ``given`` applied on top (``train`` then refuses those that would change the
    run), and ``resume=True``. A run killed before its first checkpoint has nothing to resume: it starts
    from scratch with the given arguments (``preset`` default ``tiny``), and says so."""
    given = {k: v for k, v in given.items() if k not in ("out", "resume")}
    latest = layout.latest_checkpoint(out) if Path(out).is_dir() else None
    if latest is None:  # train() says so
        return TrainConfig.from_preset(given.pop("preset", "tiny"), **given, out=str(out), resume=True)
    saved = ckpt.read_config(latest).get("training") or {}
    if not saved:
        raise UserError(f"{latest / layout.CONFIG}: records no training arguments, so the run cannot resume")
    saved = {k: v for k, v in saved.items() if k != "allow_data_change"}  # given each time, never carried over
    return TrainConfig.from_record(saved, **given, out=str(out), resume=True)


def read_log(path: Path) -> list[tuple[int, str]]:
    """The ``(step, row)`` pairs of a metrics log, each row checked to be a JSON object with an integer
    ``step``."""
    try:
        rows = [r for r in path.read_text(encoding="utf-8").splitlines() if r.strip()]
    except UnicodeDecodeError:
        raise UserError(f"{path}: not UTF-8 text; it is not a setdlm metrics log") from None
    steps = []
    for n, r in enumerate(rows, 1):
        try:
            step = json.loads(r).get("step")
        except (json.JSONDecodeError, AttributeError):
            step = None
        if not isinstance(step, int):
            raise UserError(f"{path}:{n}: not a metrics row (a JSON object with an integer \"step\"); repair or "
                             "remove the file")
        steps.append(step)
    return list(zip(steps, rows))


def truncate_log(path: Path, step: int) -> None:
    """Drop log rows past ``step``: on resume those of the steps the crash lost (they are logged again), or
    all rows of an attempt that died before its first checkpoint (:func:`check_out_dir` has refused a log of
    another run)."""
    if not path.is_file():
        return
    rows = read_log(path)
    keep = [r for s, r in rows if s <= step]
    if len(keep) < len(rows):
        write_text_atomic(path, "".join(r + "\n" for r in keep))


def append_log(out: Path, row: dict) -> None:
    try:
        with open(out / METRICS, "a", encoding="utf-8") as f:
            f.write(json.dumps(row) + "\n")
    except OSError as e:  # disk full, read-only: one line naming the file
        raise UserError(f"{out / METRICS}: cannot write ({e.strerror or e})") from None


def prune(out: Path, keep: int) -> None:
    """Keep the newest ``keep`` checkpoints; remove the leftovers of a write killed half-way."""
    root = out / "checkpoints"
    done = sorted(p for p in root.iterdir() if p.name.startswith("step-"))
    for p in done[:-keep]:
        shutil.rmtree(p, ignore_errors=True)
    for p in root.iterdir():
        if p.name.startswith("."):
            shutil.rmtree(p, ignore_errors=True)


def interrupted_note(out: str) -> str:
    """What a Ctrl-C of a run into ``out`` leaves behind, and how to continue it."""
    try:
        latest = layout.latest_checkpoint(out)
    except ValueError:
        latest = None
    if latest is None:
        return f"no checkpoint in {out} yet"
    return f"the latest checkpoint is {latest}; continue with: setdlm train --out {out} --resume"
