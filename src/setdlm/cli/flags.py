"""The command line's flags, derived from the library's typed objects: one flag per field of
:class:`~setdlm.decoding.settings.DecodeSettings` (``generate``, ``infill``, ``eval``, ``bench``) and of
:class:`~setdlm.evaluation.TaskSpec` (``eval``, ``bench``), read back into those objects. The objects check
the values (:class:`setdlm.errors.UserError`, worded with the field names); ``setdlm`` prints the names as
flags (:func:`setdlm.errors.as_flags`)."""

from __future__ import annotations

import argparse
import dataclasses
import types
import typing
from typing import Any

from ..data.tasks import LEVELS, SPLITS
from ..decoding.settings import DecodeSettings, GENERATE_ONLY
from ..errors import UserError
from ..evaluation import TaskSpec
from ..evaluation.passes import CLOCKS
from ..evaluation.registry import REGISTRY, decoding, generating, using
from ..formats.loading import DTYPES
from ..formats.quantize import QUANTIZATIONS
from .options import constraint_from_flags


def positive_int(s: str) -> int:
    try:
        v = int(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {s!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {s!r}")
    return v


def list_of(kind, what: str):
    """argparse type: a comma-separated list; ``off`` stands for None (threshold off, window D)."""
    def parse(s: str):
        out = []
        for item in s.split(","):
            item = item.strip()
            try:
                out.append(None if item in ("off", "D") else kind(item))
            except ValueError:
                raise argparse.ArgumentTypeError(f"{what}: {item!r} is not a number") from None
        return out
    return parse


def add_dtype_flag(p, what: str = "decode with", several: bool = False) -> None:
    """``--dtype``: the precision the weights are cast to (:func:`setdlm.load`'s ``dtype``); ``several``: a
    comma-separated list of them (``bench``: every checkpoint in each, side by side)."""
    note = ("default: float32 for weights stored in half precision, else as stored; bfloat16 pays on CPUs with "
            "AVX512-BF16 at batch 32, docs/decoding.md \"Precision\"")
    if several:
        p.add_argument("--dtype", type=dtypes_list, default=None, help=f"{what} weights in these precisions, "
                       f"comma-separated ({', '.join(DTYPES)}): each checkpoint in each, side by side ({note})")
    else:
        p.add_argument("--dtype", choices=tuple(DTYPES), default=None, help=f"{what} weights in this precision "
                       f"({note})")


def dtypes_list(s: str) -> list[str]:
    """argparse type of ``bench --dtype``: comma-separated names of :data:`~setdlm.formats.loading.DTYPES`."""
    out = [item.strip() for item in s.split(",")]
    bad = [d for d in out if d not in DTYPES]
    if bad or len(set(out)) < len(out):
        raise argparse.ArgumentTypeError(f"{s!r}: give distinct precisions among {', '.join(DTYPES)}")
    return out


def add_model_flags(p, what: str = "decode with", several_dtypes: bool = False) -> None:
    """The flags that pick how a model is loaded: ``--ema``, ``--device``, ``--dtype``, ``--quantize``."""
    p.add_argument("--ema", action="store_true", help=f"{what} the EMA weights")
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N")
    add_dtype_flag(p, what, several_dtypes)
    p.add_argument("--quantize", choices=QUANTIZATIONS, default=None, help="decode with int8 or int4 weights on "
                   "the CPU, or a GGUF file's own (gguf) (docs/quantization.md; default: the stored precision)")



# ---------------------------------------------------------------------------------------------------------
# decoding settings: one flag per field of DecodeSettings (generate, infill, eval, bench)
# ---------------------------------------------------------------------------------------------------------

# the constraint is an object, not one flag: generate and infill spell it --regex / --json-schema / --choice
SETTINGS = tuple(f.name for f in dataclasses.fields(DecodeSettings) if f.name != "constraint")
# values of a setting with a flag of their own (speculate="next_token": --speculate-next-token), for error messages
VALUE_FLAGS = {f.name: tuple(f.metadata["values"]) for f in dataclasses.fields(DecodeSettings)
               if "values" in f.metadata}


def value_flag(name: str, value: str) -> str:
    """The flag of a setting's value that has a flag of its own: ``("speculate", "next_token")`` →
    ``--speculate-next-token``."""
    return f"--{name.replace('_', '-')}-{value.replace('_', '-')}"


def add_settings_flags(p, names, *, defaults: dict | None = None, notes: dict | None = None) -> None:
    """One flag per field of :class:`DecodeSettings` in ``names``, derived from the dataclass (type, help,
    choices) as ``train``'s flags are from ``TrainConfig``; a flag not given is None. ``defaults``: flag
    defaults of this command; ``notes``: a prefix for a flag's help (e.g. the tasks it applies to)."""
    hints = typing.get_type_hints(DecodeSettings)
    for f in dataclasses.fields(DecodeSettings):
        if f.name not in names:
            continue
        flag, meta = "--" + f.name.replace("_", "-"), f.metadata
        kind = hints[f.name]
        union = typing.get_origin(kind) in (typing.Union, types.UnionType)  # X | None, int | tuple[int, ...]
        kinds = [a for a in typing.get_args(kind) if a is not type(None)] if union else [kind]
        default = (defaults or {}).get(f.name)
        help_ = (notes or {}).get(f.name, "") + meta["help"]
        help_ += f" (default {default})" if default is not None else ""
        if kinds[0] is bool:  # a switch; a value of its own is a flag of its own, and one of them at most
            group = p.add_mutually_exclusive_group() if meta.get("values") else p
            group.add_argument(flag, action="store_true", default=None, help=help_)
            for value, more in meta.get("values", {}).items():  # --speculate-next-token: speculate="next_token"
                group.add_argument(value_flag(f.name, value), dest=f.name, action="store_const", const=value,
                                   default=None, help=more)
        elif "nargs" in meta:  # length_penalty START FACTOR
            p.add_argument(flag, nargs=meta["nargs"], default=None, metavar=("START", "FACTOR"), help=help_)
        elif typing.get_origin(kinds[-1]) is tuple:  # stop, eos_token_id: repeatable
            p.add_argument(flag, action="append", type=typing.get_args(kinds[-1])[0], default=None, help=help_)
        elif typing.get_origin(kinds[0]) is typing.Literal:  # cache_order, verify_layout: one of its values
            p.add_argument(flag, choices=meta.get("choices", typing.get_args(kinds[0])), default=default, help=help_)
        else:
            p.add_argument(flag, type=kinds[0], choices=meta.get("choices"), default=default, help=help_)


def decode_settings(args) -> DecodeSettings:
    """The :class:`DecodeSettings` of the decoding flags given (and of --regex/--json-schema/--choice where
    the command has them), each value checked by the dataclass itself; its errors name the flag."""
    kw: dict[str, Any] = {}  # argparse's values (untyped), each checked by DecodeSettings itself
    for name in SETTINGS:
        raw = getattr(args, name, None)
        if raw is None:
            continue
        v = raw
        if name == "length_penalty":
            try:
                v = (int(raw[0]), float(raw[1]))
            except ValueError:
                raise UserError("length_penalty takes START FACTOR (an integer and a number), got "
                                f"{' '.join(raw)}", fields=(name,)) from None
        try:
            DecodeSettings(**{name: v})
        except (ValueError, TypeError) as e:  # the library's message names the field: the flag, when printed
            raise UserError(str(e), fields=(name,)) from None
        kw[name] = v
    if hasattr(args, "regex"):
        kw["constraint"] = constraint_from_flags(args.regex, args.json_schema, args.choice)
    return DecodeSettings(**kw)



def task_spec(args):
    """The :class:`~setdlm.evaluation.TaskSpec` of the task flags (checked when built)."""

    return TaskSpec(args.task, data=args.data, level=args.level, split=args.split, n=args.n, hidden=args.hidden,
                    eos=args.eos, seed=args.seed)



def applies_to(name: str, kind: str = "fields") -> str:
    """``"reasoning/infill: "``: the tasks a TaskSpec field (``kind="fields"``) or an evaluation option
    (``kind="options"``) applies to, as the start of its flag's help."""

    return "/".join(using(kind, name)) + ": "


def add_task_flags(p, *, settings: tuple[str, ...], task_default: str | None) -> None:
    """Flags that pick the task's examples (the fields of TaskSpec), and the decoding ``settings`` offered;
    the task choices and which tasks a flag applies to come from the task registry."""

    p.add_argument("--task", choices=tuple(REGISTRY), default=task_default, required=task_default is None,
                   help="what to measure: " + "; ".join(f"{t.name}, {t.title}" for t in REGISTRY.values())
                   + (f" (default {task_default})" if task_default else ""))
    p.add_argument("--data", default=None, help="; ".join(f"{t.name}: {t.notes['data']}" for t in REGISTRY.values()
                                                         if "data" in t.notes))
    p.add_argument("--level", choices=tuple(LEVELS), default=None, help=applies_to("level") + "difficulty of the "
                   "generated problems (default medium)")
    p.add_argument("--split", choices=SPLITS, default=None,
                   help=applies_to("split") + "split drawn from (default test)")
    p.add_argument("--n", type=positive_int, default=None, help=applies_to("n") + "examples (default 200 generated "
                   "ones, or every window of a text source that fits the context)")
    p.add_argument("--hidden", type=int, choices=(1, 3), default=None, help=applies_to("hidden") + "hidden sentences "
                   "of 5 (default 1)")
    p.add_argument("--eos", action="store_true", help=applies_to("eos") + "EOS after the suffix (each window a whole "
                   "document)")
    p.add_argument("--clock", choices=CLOCKS, default=None, help=applies_to("clock", "options") + "time "
                   "decoding by wall clock (default, the paper's) or by CPU time (steady on a shared CPU)")
    generate_notes = "/".join(generating()) + ": "
    notes = {name: (generate_notes if name in GENERATE_ONLY else "/".join(decoding()) + ": ") for name in settings}
    notes["max_new_tokens"] = generate_notes[:-2] + " (default: min(256, what the longest prompt leaves of L)): "
    notes["cache_order"] = generate_notes[:-2] + " (the paper's GSM8K runs: reveal): "
    add_settings_flags(p, settings, notes=notes)
    p.set_defaults(**{name: None for name in SETTINGS if name not in settings})
