"""``setdlm train`` and ``python -m setdlm.training`` (and ``setdlm export``): one parser, one flag per field of the
training
configuration (:func:`~setdlm.training.config.config_fields`), defaults from ``--preset``."""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import fields

from ..errors import UserError
from ..family import FAMILIES
from ..formats import layout
from ..presets import PRESETS
from ..training import consolidate
from ..training.sharded import is_sharded
from ..training.drafter import DrafterTrainConfig, train_drafter
from ..training.config import STRATEGIES, TrainConfig, config_fields, field_type
from ..training.loop import train
from ..training.run_folder import interrupted_note, resume_config
from .command import Parser, run

_CHOICES = {"family": FAMILIES, "lr_schedule": ("constant", "cosine"), "strategy": STRATEGIES}


def add_train_arguments(p: argparse.ArgumentParser) -> None:
    """One flag per field of :class:`TrainConfig` (``--preset`` among them); ``p`` must be made with
    ``argument_default=argparse.SUPPRESS``, so that only the flags given override the preset."""
    for f in config_fields():
        flag = "--" + (f.name if f.name in ("D", "M", "k") else f.name.replace("_", "-"))
        kind, help_ = field_type(f.name), f.metadata.get("help", "")
        if f.name == "preset":
            p.add_argument(flag, choices=tuple(PRESETS), help="tiny (CPU, seconds), quick (the quick start: "
                                                              "recognizable "
                           "words in under two minutes on 2 cores), small (probe size), lm1b, owt")
        elif kind is bool:  # --flag / --no-flag: a preset may turn one on (keep_clean_bos)
            p.add_argument(flag, action=argparse.BooleanOptionalAction, help=help_)
        elif f.name == "out":
            p.add_argument(flag, required=True, help=help_)
        else:
            p.add_argument(flag, type=kind, choices=_CHOICES.get(f.name), help=help_)


def run_train(args: argparse.Namespace) -> int:
    """Train a model (any family) on your text or a built-in corpus; resumable, torchrun-ready."""
    given = {f.name: getattr(args, f.name) for f in config_fields() if hasattr(args, f.name)}  # flags given only
    if given.get("preset", "tiny") not in PRESETS:
        raise UserError(f"unknown preset {given['preset']!r}; choose one of {', '.join(PRESETS)}")
    if given.get("resume"):  # the saved configuration; only the flags given are compared with it
        cfg = resume_config(given.pop("out"), **given)
    else:
        cfg = TrainConfig.from_preset(given.pop("preset", "tiny"), **given)
    result = train(cfg)
    if result.eval is not None and os.environ.get("RANK", "0") == "0":  # once, not once per process
        e = result.eval
        print(f"step {result.step}: loss {result.loss:.4f}, held-out nelbo {e['nelbo']:.4f} nats/token "
              f"(ppl {e['ppl']:.2f}), {result.tokens_per_second:,.0f} tokens/s; checkpoint {result.checkpoint}")
    return 0


def run_export(args: argparse.Namespace) -> int:
    """Convert an FSDP run's sharded checkpoints into the single-file weights that setdlm.load reads (one
    process, no GPU; a run folder exports its latest checkpoint; a plain run's is loadable as it is)."""
    for folder in args.folders:
        plain = layout.resolve(folder)
        if not is_sharded(plain) and (plain / layout.WEIGHTS).is_file():  # a plain (not FSDP) run: nothing to do
            print(f"{plain}: already single-file weights ({layout.WEIGHTS}), which setdlm.load, setdlm generate and "
                  "setdlm eval read as they are; nothing to export", file=sys.stderr)
            print(plain)
            continue
        print(consolidate(folder))
    return 0


_DESCRIPTION = (run_train.__doc__ or "") + " Defaults come from --preset; every flag overrides it."


def run_train_drafter(args: argparse.Namespace) -> int:
    """Train a set drafter beside a frozen pretrained model on its own greedy outputs (docs/drafter.md);
    resumable: the same command continues a killed run."""
    given = {f.name: getattr(args, f.name) for f in fields(DrafterTrainConfig) if hasattr(args, f.name)}
    folder = train_drafter(DrafterTrainConfig(**given))
    print(f"drafter: {folder} (setdlm.load({str(folder)!r}) decodes the base with its drafts under "
          f"speculate='next_token'; acceptance curve: {folder.parent / 'acceptance.png'})")
    return 0


def add_drafter_command(sub, summary) -> None:
    """``setdlm train-drafter``: one flag per field of :class:`DrafterTrainConfig`."""
    p = sub.add_parser("train-drafter", help=summary(run_train_drafter), argument_default=argparse.SUPPRESS,
                       description=run_train_drafter.__doc__)
    for f in fields(DrafterTrainConfig):
        p.add_argument("--" + f.name.replace("_", "-"), dest=f.name, type=type(f.default),
                       help=f"default {f.default}")
    p.set_defaults(func=run_train_drafter)


def add_train_commands(sub, summary) -> None:
    """``setdlm train`` and ``setdlm export`` on the subparsers ``sub`` (``summary``: a command's one-line help)."""
    p = sub.add_parser("train", help=summary(run_train), argument_default=argparse.SUPPRESS, description=_DESCRIPTION)
    add_train_arguments(p)
    p.set_defaults(func=run_train)
    e = sub.add_parser("export", help=summary(run_export), description=run_export.__doc__)
    e.add_argument("folders", nargs="+", metavar="CHECKPOINT_OR_RUN", help="checkpoint or run folder(s)")
    e.set_defaults(func=run_export)
    add_drafter_command(sub, summary)


def build_parser() -> argparse.ArgumentParser:
    """The parser of ``python -m setdlm.training`` (the same flags as ``setdlm train``)."""
    p = Parser(prog="setdlm train", argument_default=argparse.SUPPRESS, description=_DESCRIPTION)
    add_train_arguments(p)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    return run("train", lambda: run_train(args), lambda e: interrupted_note(args.out))
