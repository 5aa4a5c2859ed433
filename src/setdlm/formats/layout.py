"""A setdlm checkpoint folder's file names, finding one, and reading its JSON with errors naming the file and
the key (docs/method.md §9.3, §9.5; the folder is described in :mod:`setdlm.formats.checkpoint`)."""

from __future__ import annotations

import dataclasses
import json
import typing
from pathlib import Path

from ..errors import UserError

CONFIG, WEIGHTS, EMA_WEIGHTS, CARD = "config.json", "model.safetensors", "ema.safetensors", "README.md"
STATE, OPTIMIZER, LATEST = "training_state.json", "optimizer.safetensors", "latest"
SHARDED = "sharded"  # the torch.distributed.checkpoint folder of an FSDP run's checkpoint (setdlm.training.sharded)
FORMAT, FORMAT_VERSION = "setdlm", 1


def is_checkpoint(folder: Path) -> bool:
    try:
        return json.loads((Path(folder) / CONFIG).read_text(encoding="utf-8")).get("format") == FORMAT
    except (OSError, ValueError, AttributeError):
        return False


def resolve(path: str | Path) -> Path:
    """A checkpoint folder, or a training run folder whose ``latest`` names one."""
    p = Path(path)
    if not p.exists():
        raise UserError(f"checkpoint {str(p)!r} does not exist")
    if not p.is_dir():
        raise UserError(f"checkpoint {str(p)!r} is not a folder")
    if not (p / CONFIG).exists() and (p / LATEST).is_file():
        try:
            target = (p / LATEST).read_text(encoding="utf-8").strip()
        except UnicodeDecodeError:
            raise UserError(f"{p / LATEST}: not a text file (it should name a checkpoint folder, e.g. "
                            "checkpoints/step-00000100)") from None
        if not target or Path(target).is_absolute() or ".." in Path(target).parts:
            raise UserError(f"{p / LATEST}: {target!r} is not a checkpoint folder inside {p}")
        if not (p / target / CONFIG).exists():
            raise UserError(f"{p / LATEST}: points to {target!r}, which holds no {CONFIG}")
        return p / target
    return p


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    p = Path(run_dir) / LATEST
    return resolve(run_dir) if p.is_file() else None


def read_json(path: Path, missing: str) -> dict:
    """A JSON file, or a ``ValueError`` naming it: ``missing (<missing>)`` or ``not valid JSON``."""
    if not path.is_file():
        raise UserError(f"{path}: missing ({missing})")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise UserError(f"{path}: not valid JSON ({e})") from None


_KINDS = {int: (int,), float: (int, float), str: (str,), bool: (bool,)}
# keys added to the format after models were saved without them: absent means the behaviour from before the key
# existed (its default), so older checkpoints (the shipped models among them) load unchanged
_ADDED_LATER = {"keep_clean_bos", "ar_weight"}


def check_fields(path: Path, section: str, d: dict, cls) -> None:
    """Every field of the dataclass ``cls`` present in ``d`` (``config.json``'s ``section``) with a value of
    its type: a key that is missing or mistyped is an error naming the key and the file, never a default
    filled in (a 2-head checkpoint must not load as the default 4 heads)."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if f.name not in d and f.name in _ADDED_LATER:
            continue
        if f.name not in d:
            raise UserError(f"{path}: {section!r} lacks the key {f.name!r}; the file is incomplete or was edited "
                            "(re-save the model, or restore the key)")
        v, kind = d[f.name], hints[f.name]
        optional = type(None) in typing.get_args(kind)
        base = next((a for a in typing.get_args(kind) if a is not type(None)), kind)
        if v is None and optional:
            continue
        if (isinstance(v, bool) and base is not bool) or not isinstance(v, _KINDS.get(base, (base,))):
            want = base.__name__ + (" or null" if optional else "")
            raise UserError(f"{path}: {section}.{f.name} must be {want}, got {json.dumps(v)}")
