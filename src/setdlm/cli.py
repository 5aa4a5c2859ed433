"""The ``setdlm`` command line: thin wrappers over typed library functions.

Every subcommand is registered in ``COMMANDS`` below; ``setdlm --help`` lists them:

* ``train``    — :func:`setdlm.train.train` (flags = the fields of :class:`setdlm.train.TrainConfig`)
* ``eval``     — the held-out likelihood bound of a checkpoint (:func:`setdlm.train.likelihood`)
* ``generate`` — :func:`setdlm.decoding.generate` on prompts from arguments, a file or stdin
* ``infill``   — :func:`setdlm.decoding.infill`
* ``schedule`` — print the position-offset schedule for (L, D, M)
* ``convert``  — :func:`setdlm.convert.convert_reference`: the authors' checkpoints → a setdlm checkpoint

Bad arguments print a one-line error naming the bad value and exit with code 2; nothing is written then.
"""

from __future__ import annotations

import argparse
import json
import sys
import typing
from pathlib import Path

from .data.sources import iter_jsonl


class _Parser(argparse.ArgumentParser):
    """Usage errors as one line (``setdlm train: error: ...``), exit code 2."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message}\n")


def _positive_int(s: str) -> int:
    try:
        v = int(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {s!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {s!r}")
    return v


def _read_utf8(path: str) -> str:
    """A file's text, or stdin for ``-``; non-UTF-8 input is a ``ValueError`` naming the source."""
    if path == "-":
        data, name = sys.stdin.buffer.read(), "<stdin>"
    else:
        p = Path(path)
        if not p.is_file():
            raise ValueError(f"input file {path!r} does not exist")
        data, name = p.read_bytes(), path
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{name}: not UTF-8 text (byte 0x{data[e.start]:02x} at offset {e.start})") from None


def _write_atomic(path: str, text: str) -> None:
    from .checkpoint import write_text_atomic

    Path(path).parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(Path(path), text)


# ---------------------------------------------------------------------------------------------------------
# schedule
# ---------------------------------------------------------------------------------------------------------


def _schedule(args) -> int:
    """Print the position-offset schedule for (L, D, M): b, k, spacing, expected active tokens."""
    from .schedules import StaggeredSchedule

    s = StaggeredSchedule.from_dm(args.L, args.D, args.M)
    print(f"L={s.L} D={s.D} M={s.M}  b={s.b:.7g}  k={s.k:.7g}  b/spacing={s.b / s.spacing:.6g}  "
          f"expected active tokens C={s.budget:.6g}")
    return 0


def _add_schedule(sub) -> None:
    p = sub.add_parser("schedule", help=_schedule.__doc__.splitlines()[0])
    p.add_argument("--L", type=int, required=True, help="context length")
    p.add_argument("--D", type=int, required=True, help="target parallelism (matched BD3LM block size)")
    p.add_argument("--M", type=int, default=None, help="max set size (default 2D)")
    p.set_defaults(func=_schedule)


# ---------------------------------------------------------------------------------------------------------
# train
# ---------------------------------------------------------------------------------------------------------

_CHOICES = {"family": ("ar", "mdlm", "bd3lm", "setdlm"), "lr_schedule": ("constant", "cosine")}
_FAMILY_FLAGS = {"D": ("setdlm",), "M": ("setdlm",), "k": ("setdlm",), "block_size": ("bd3lm", "mdlm")}


def _train(args) -> int:
    """Train a model (any family) on your text or a built-in corpus; resumable, torchrun-ready."""
    from .presets import PRESETS
    from .train import TrainConfig, config_fields, resume_config, train

    given = {f.name: getattr(args, f.name) for f in config_fields() if hasattr(args, f.name)}
    preset = given.pop("preset", "tiny")
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; choose one of {', '.join(PRESETS)}")
    if given.get("resume"):
        cfg = resume_config(given.pop("out"), preset=preset, **given)
    else:
        cfg = TrainConfig.from_preset(preset, **given)
    for name, families in _FAMILY_FLAGS.items():
        if name in given and cfg.family not in families:
            raise ValueError(f"--{name.replace('_', '-')} applies to {' and '.join(families)}, not to family "
                             f"{cfg.family!r}")
    result = train(cfg)
    if result.eval is not None:
        e = result.eval
        print(f"step {result.step}: loss {result.loss:.4f}, held-out nelbo {e['nelbo']:.4f} nats/token "
              f"(ppl {e['ppl']:.2f}), {result.tokens_per_second:,.0f} tokens/s; checkpoint {result.checkpoint}")
    return 0


def _add_train(sub) -> None:
    from .presets import PRESETS
    from .train import TrainConfig, config_fields

    p = sub.add_parser("train", help=_train.__doc__.splitlines()[0], argument_default=argparse.SUPPRESS,
                       description=_train.__doc__ + " Defaults come from --preset; every flag overrides it.")
    hints = typing.get_type_hints(TrainConfig)
    for f in config_fields():
        flag = "--" + (f.name if f.name in ("D", "M", "k") else f.name.replace("_", "-"))
        kind = hints[f.name]
        kind = next((a for a in typing.get_args(kind) if a is not type(None)), kind)
        help_ = f.metadata.get("help", "")
        if f.name == "preset":
            p.add_argument(flag, choices=tuple(PRESETS), help="tiny (CPU, seconds), small (probe size), lm1b, owt")
        elif kind is bool:
            p.add_argument(flag, action="store_true", help=help_)
        elif f.name == "out":
            p.add_argument(flag, required=True, help=help_)
        else:
            p.add_argument(flag, type=kind, choices=_CHOICES.get(f.name), help=help_)
    p.set_defaults(func=_train)


# ---------------------------------------------------------------------------------------------------------
# eval
# ---------------------------------------------------------------------------------------------------------


def _eval_likelihood(model, args, training: dict) -> dict:
    """The family's likelihood bound (SPEC §5.1) on ``--data`` (every row) or the run's held-out rows."""
    from .data import build_dataset, read_source
    from .train import heldout_of, likelihood

    if args.data is not None:
        data = build_dataset(read_source(args.data), model.tokenizer, model.family.length)
    elif training:
        data = heldout_of(training, model.tokenizer)
    else:
        raise ValueError(f"{args.checkpoint} records no training data: pass --data")
    bs = args.batch_size or training.get("eval_batch_size", 16)
    seed = training.get("eval_seed", 1) if args.seed is None else args.seed
    bf16 = args.bf16 or bool(training.get("bf16", False))
    res = likelihood(model.backbone, model.family, data, batch_size=bs, seed=seed, bf16=bf16,
                     device=next(model.backbone.parameters()).device, progress=True)
    return {"task": "likelihood", "family": model.family.family, **res}


EVALUATIONS = {"likelihood": _eval_likelihood}  # name -> fn(model, args, training_args) -> dict


def _eval(args) -> int:
    """Evaluate a checkpoint: the held-out likelihood bound (NELBO, PPL) on its data or on --data."""
    from .checkpoint import load, read_config, resolve

    model = load(args.checkpoint, ema=args.ema, device=args.device)
    training = read_config(resolve(args.checkpoint)).get("training") or {}
    result = EVALUATIONS[args.task](model, args, training)
    line = json.dumps(result)
    if args.output:
        _write_atomic(args.output, line + "\n")
    print(line)
    return 0


def _add_eval(sub) -> None:
    p = sub.add_parser("eval", help=_eval.__doc__.splitlines()[0])
    p.add_argument("checkpoint", help="checkpoint folder or training run folder")
    p.add_argument("--task", choices=tuple(EVALUATIONS), default="likelihood", help="what to measure")
    p.add_argument("--data", default=None, help="text file, folder, .jsonl, built-in corpus or hf:NAME "
                   "(default: the run's held-out rows)")
    p.add_argument("--batch-size", type=_positive_int, default=None, help="rows per batch (default: the run's)")
    p.add_argument("--seed", type=int, default=None, help="seed of the random orders/masks (default: the run's)")
    p.add_argument("--ema", action="store_true", help="evaluate the EMA weights")
    p.add_argument("--bf16", action="store_true", help="bf16 autocast (default: as trained)")
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N")
    p.add_argument("--output", default=None, help="also write the result as JSON to this file")
    p.set_defaults(func=_eval)


# ---------------------------------------------------------------------------------------------------------
# generate / infill
# ---------------------------------------------------------------------------------------------------------

# flag -> (families it applies to or None for all, check, what the check demands)
_DECODE_FLAGS = {
    "window": (("setdlm",), lambda v: v >= 1, "a positive integer"),
    "block_size": (("bd3lm", "mdlm"), lambda v: v >= 1, "a positive integer"),
    "threshold": (("setdlm", "bd3lm", "mdlm"), lambda v: 0 < v <= 1, "in (0, 1]"),
    "temperature": (None, lambda v: v >= 0, ">= 0"),
    "top_p": (None, lambda v: 0 < v <= 1, "in (0, 1]"),
    "top_k": (None, lambda v: v >= 0, ">= 0"),
    "repetition_penalty": (None, lambda v: v > 0, "> 0"),
}


def _add_decoding_flags(p) -> None:
    p.add_argument("checkpoint", help="checkpoint folder or training run folder")
    p.add_argument("--window", type=int, default=None, help="setdlm: sliding window w (default D)")
    p.add_argument("--block-size", type=int, default=None, help="bd3lm/mdlm: block size")
    p.add_argument("--threshold", type=float, default=None, help="also commit tokens with probability >= this")
    p.add_argument("--temperature", type=float, default=None, help="0 = greedy")
    p.add_argument("--top-p", type=float, default=None, help="nucleus sampling")
    p.add_argument("--top-k", type=int, default=None, help="top-k sampling (0 = off)")
    p.add_argument("--repetition-penalty", type=float, default=None, help="> 1 discourages repeats")
    p.add_argument("--seed", type=int, default=0, help="sampling seed")
    p.add_argument("--ema", action="store_true", help="decode with the EMA weights")
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N")
    p.add_argument("--output", default=None, help="write JSONL results here instead of printing texts")


def _decoding_kwargs(args, family: str) -> dict:
    """The decoding flags the user gave, checked for range and for the model's family."""
    kw = {}
    for name, (families, ok, demand) in _DECODE_FLAGS.items():
        v = getattr(args, name)
        if v is None:
            continue
        flag = "--" + name.replace("_", "-")
        if not ok(v):
            raise ValueError(f"{flag} must be {demand}, got {v}")
        if families is not None and family not in families:
            raise ValueError(f"{flag} applies to {'/'.join(families)} models; this checkpoint is {family!r}")
        kw[name] = v
    return kw


def _check_ranges(args) -> None:
    """Range checks that need no model, so that they fail before a checkpoint is read."""
    for name, (_, ok, demand) in _DECODE_FLAGS.items():
        v = getattr(args, name)
        if v is not None and not ok(v):
            raise ValueError(f"--{name.replace('_', '-')} must be {demand}, got {v}")


def _n_tokens(tok, text: str) -> int:
    return len(tok.encode(text)) + (tok.bos_token_id is not None)


def _read_prompts(args) -> list[str]:
    prompts = list(args.prompt or [])
    if args.input:
        text = _read_utf8(args.input)
        if args.input.endswith(".jsonl"):
            for n, rec in iter_jsonl(text, args.input):
                if not isinstance(rec.get("prompt"), str):
                    raise ValueError(f"{args.input}:{n}: expected an object with a string 'prompt'")
                prompts.append(rec["prompt"])
        else:
            prompts += [line for line in text.splitlines() if line.strip()]
    if not prompts:
        raise ValueError("no prompts: pass --prompt TEXT (\"\" for unconditional), --input FILE or --input -")
    return prompts


def _report(out, rows: list[dict], args) -> int:
    print(f"nfe={out.nfe} tokens/step={out.tokens_per_step:.3f} seconds={out.seconds:.3f} "
          f"tokens/s={out.tokens_per_second:.1f}", file=sys.stderr)
    if args.output:
        _write_atomic(args.output, "".join(json.dumps(r) + "\n" for r in rows))
    else:
        print("\n\n".join(r["text"] for r in rows))
    return 0


def _generate(args) -> int:
    """Decode continuations of prompts (arguments, a file or stdin) with the family's decoder."""
    from .checkpoint import load

    if args.max_new_tokens < 1:
        raise ValueError(f"--max-new-tokens must be a positive integer, got {args.max_new_tokens}")
    _check_ranges(args)
    prompts = _read_prompts(args)
    model = load(args.checkpoint, ema=args.ema, device=args.device)
    kw = _decoding_kwargs(args, model.family.family)
    L = model.family.length
    for i, p in enumerate(prompts):
        n = _n_tokens(model.tokenizer, p)
        if n >= L:
            raise ValueError(f"prompt {i} is {n} tokens long, which leaves no room in the context length L={L}")
    from .decoding import generate

    out = generate(model, prompts, max_new_tokens=args.max_new_tokens, stop=args.stop or None, seed=args.seed, **kw)
    rows = [{"prompt": p, "text": t, "tokens": [int(x) for x in ids]} for p, t, ids in zip(prompts, out.texts, out.tokens)]
    return _report(out, rows, args)


def _add_generate(sub) -> None:
    p = sub.add_parser("generate", help=_generate.__doc__.splitlines()[0])
    _add_decoding_flags(p)
    p.add_argument("--prompt", action="append", help="a prompt (repeatable; \"\" for unconditional)")
    p.add_argument("--input", default=None, help="prompts, one per line (or .jsonl with 'prompt'); - for stdin")
    p.add_argument("--max-new-tokens", type=int, default=128, help="tokens to generate per prompt")
    p.add_argument("--stop", action="append", help="stop string (repeatable)")
    p.set_defaults(func=_generate)


def _read_infill(args) -> list[tuple[str, str, int]]:
    rows = []
    if args.prefix is not None or args.suffix is not None or args.length is not None:
        if args.length is None:
            raise ValueError("--length is required with --prefix/--suffix")
        rows.append((args.prefix or "", args.suffix or "", args.length))
    if args.input:
        for n, rec in iter_jsonl(_read_utf8(args.input), args.input):
            if not (isinstance(rec.get("prefix", ""), str) and isinstance(rec.get("suffix", ""), str)
                    and isinstance(rec.get("length"), int)):
                raise ValueError(f"{args.input}:{n}: expected {{\"prefix\": str, \"suffix\": str, \"length\": int}}")
            rows.append((rec.get("prefix", ""), rec.get("suffix", ""), rec["length"]))
    if not rows:
        raise ValueError("nothing to infill: pass --prefix/--suffix/--length or --input FILE.jsonl")
    for i, (_, _, n) in enumerate(rows):
        if n < 1:
            raise ValueError(f"infill length must be a positive integer, got {n} (row {i})")
    return rows


def _infill(args) -> int:
    """Fill LENGTH tokens between a prefix and a suffix (SetDLM, BD3LM, MDLM; AR sees the prefix only)."""
    from .checkpoint import load

    _check_ranges(args)
    rows = _read_infill(args)
    model = load(args.checkpoint, ema=args.ema, device=args.device)
    kw = _decoding_kwargs(args, model.family.family)
    L = model.family.length
    for i, (pre, suf, n) in enumerate(rows):
        total = _n_tokens(model.tokenizer, pre) + n + len(model.tokenizer.encode(suf))
        if total > L:
            raise ValueError(f"row {i}: prefix + {n} infilled tokens + suffix = {total} tokens, more than the "
                             f"context length L={L}")
    from .decoding import infill

    out = infill(model, [r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows], seed=args.seed, **kw)
    res = [{"prefix": p, "suffix": s, "length": n, "text": t, "tokens": [int(x) for x in ids]}
           for (p, s, n), t, ids in zip(rows, out.texts, out.tokens)]
    return _report(out, res, args)


def _add_infill(sub) -> None:
    p = sub.add_parser("infill", help=_infill.__doc__.splitlines()[0])
    _add_decoding_flags(p)
    p.add_argument("--prefix", default=None, help="text before the gap")
    p.add_argument("--suffix", default=None, help="text after the gap")
    p.add_argument("--length", type=int, default=None, help="tokens to fill")
    p.add_argument("--input", default=None, help="JSONL rows {prefix, suffix, length}; - for stdin")
    p.set_defaults(func=_infill)


# ---------------------------------------------------------------------------------------------------------
# convert
# ---------------------------------------------------------------------------------------------------------

_DTYPES = {"float32": "float32", "bfloat16": "bfloat16", "float16": "float16"}


def _convert(args) -> int:
    """Convert a checkpoint of the paper's authors (folder or Hub id) into a setdlm checkpoint folder."""
    import torch

    from .convert import convert_reference
    from .checkpoint import read_config

    for flag in ("D", "M"):
        v = getattr(args, flag)
        if v is not None and v < 1:
            raise ValueError(f"--{flag} must be a positive integer, got {v}")
    dtype = getattr(torch, args.dtype) if args.dtype else None
    out = convert_reference(args.from_reference, args.out, tokenizer=args.tokenizer, D=args.D, M=args.M,
                            base=args.base, dtype=dtype, revision=args.revision)
    cfg = read_config(out)
    fam = cfg["family"]
    extra = f" D={fam['D']} M={fam['M']}" if fam["family"] == "setdlm" else ""
    print(f"wrote {out}: {fam['family']} L={fam['length']}{extra}, {cfg['backbone']} backbone, "
          f"mask id {fam['mask_token_id']}, tokenizer of {cfg['tokenizer']['vocab_size']} tokens")
    return 0


def _add_convert(sub) -> None:
    p = sub.add_parser("convert", help=_convert.__doc__.splitlines()[0], description=_convert.__doc__)
    p.add_argument("--from-reference", required=True, metavar="SRC",
                   help="folder or Hub id in the authors' layout, e.g. kuleshov-group/owt-setdlm-smax16")
    p.add_argument("out", help="the setdlm checkpoint folder to write")
    p.add_argument("--tokenizer", default=None, help="tokenizer folder or Hub name (default: the checkpoint's own, "
                   "else the dataset's: gpt2, bert-base-uncased, Qwen3)")
    p.add_argument("--D", type=int, default=None, help="override D (default: from the config or the name)")
    p.add_argument("--M", type=int, default=None, help="override M (default: min(2D, L), as the authors' loader)")
    p.add_argument("--base", default=None, help="Qwen3 checkpoints: folder or Hub id of the base model's config")
    p.add_argument("--dtype", choices=tuple(_DTYPES), default=None, help="cast the weights (default: as stored)")
    p.add_argument("--revision", default=None, help="Hub branch, tag or commit")
    p.set_defaults(func=_convert)


COMMANDS = [_add_train, _add_eval, _add_generate, _add_infill, _add_schedule, _add_convert]


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="setdlm", description="Set diffusion language models.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add in COMMANDS:
        add(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except ValueError as e:  # bad user input: one line, exit 2
        print(f"setdlm {args.command}: error: {str(e).splitlines()[0] if str(e) else type(e).__name__}",
              file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
