"""The ``setdlm`` command line: thin wrappers over typed library functions.

Every subcommand is registered in ``COMMANDS`` below; ``setdlm --help`` lists them:

* ``train``    — :func:`setdlm.train.train` (flags = the fields of :class:`setdlm.train.TrainConfig`)
* ``eval``     — a checkpoint's likelihood bound (:func:`setdlm.evaluate.likelihood`), reasoning accuracy or
  infilling ROUGE (:func:`setdlm.evaluate.reasoning`, :func:`~setdlm.evaluate.infill`)
* ``bench``    — speed/quality sweeps over checkpoints (:mod:`setdlm.bench`): table, Pareto plot, JSON
* ``generate`` — :func:`setdlm.decoding.generate` on prompts from arguments, a file or stdin
* ``infill``   — :func:`setdlm.decoding.infill`
* ``schedule`` — print the position-offset schedule for (L, D, M)
* ``convert``  — :func:`setdlm.convert.convert_reference`: the authors' checkpoints → a setdlm checkpoint
* ``demo``     — :func:`setdlm.demo.run_demo`: the shipped models at work (what `make demo` runs)
* ``serve``    — :func:`setdlm.serve.serve`: an OpenAI-compatible server with continuous batching

Bad arguments print a one-line error naming the bad value and exit with code 2; nothing is written then.
The checks live in the library (shared with the Python API) and run before any work; Ctrl-C exits with
code 130 and one line saying what is left. The table of errors: docs/errors.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import types
import typing
from pathlib import Path

from .command import Parser, run
from .data.prompt import encode_prompt
from .data.sources import iter_jsonl
from .decoding.settings import FAMILIES, GENERATE_ONLY, DecodeSettings
from .outputs import write_text


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

def _add_train(sub) -> None:
    from .train import add_train_arguments, run_train

    p = sub.add_parser("train", help=run_train.__doc__.splitlines()[0], argument_default=argparse.SUPPRESS,
                       description=run_train.__doc__ + " Defaults come from --preset; every flag overrides it.")
    add_train_arguments(p)
    p.set_defaults(func=run_train)


# ---------------------------------------------------------------------------------------------------------
# decoding settings: one flag per field of DecodeSettings (generate, infill, eval, bench)
# ---------------------------------------------------------------------------------------------------------

# the constraint is an object, not one flag: generate and infill spell it --regex / --json-schema / --choice
SETTINGS = tuple(f.name for f in dataclasses.fields(DecodeSettings) if f.name != "constraint")
CONSTRAINT_FLAGS = ("regex", "json_schema", "choice")


# the CLI's own words for these ranges; for the other settings the library's message, naming the flag
_RANGES = {"threshold": "in (0, 1]", "temperature": ">= 0", "top_p": "in (0, 1]", "top_k": ">= 0"}


def _add_settings_flags(p, names, *, defaults: dict | None = None, notes: dict | None = None) -> None:
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
        if kinds[0] is bool:
            p.add_argument(flag, action="store_true", default=None, help=help_)
        elif "nargs" in meta:  # length_penalty START FACTOR
            p.add_argument(flag, nargs=meta["nargs"], default=None, metavar=("START", "FACTOR"), help=help_)
        elif typing.get_origin(kinds[-1]) is tuple:  # stop, eos_token_id: repeatable
            p.add_argument(flag, action="append", type=typing.get_args(kinds[-1])[0], default=None, help=help_)
        else:
            p.add_argument(flag, type=kinds[0], choices=meta.get("choices"), default=default, help=help_)


def _decode_settings(args, family: str | None = None) -> DecodeSettings:
    """The :class:`DecodeSettings` of the decoding flags given, each value checked by the dataclass itself;
    with ``family`` (generate, infill), a flag of another family is an error naming the flag, else (eval,
    bench) the library checks each model."""
    kw = {}
    for name in SETTINGS:
        v = getattr(args, name, None)
        if v is None:
            continue
        flag = "--" + name.replace("_", "-")
        if name == "length_penalty":
            try:
                v = (int(v[0]), float(v[1]))
            except ValueError:
                raise ValueError("--length-penalty takes START FACTOR (an integer and a number), got "
                                 f"{' '.join(v)}") from None
        try:
            DecodeSettings(**{name: v})
        except (ValueError, TypeError) as e:  # the library's message names the field: name the flag
            why = f"must be {_RANGES[name]}, got {v}" if name in _RANGES else str(e).partition(" ")[2]
            raise ValueError(f"{flag} {why}") from None
        families = FAMILIES.get(name)
        if family is not None and families is not None and family not in families:
            raise ValueError(f"{flag} applies to {'/'.join(families)} models; this checkpoint is {family!r}")
        kw[name] = v
    constraint = _constraint(args)
    if constraint is not None:
        kw["constraint"] = constraint
    return DecodeSettings(**kw)


def _constraint(args):
    """The constraint of ``--regex``, ``--json-schema`` (inline JSON or a file) or ``--choice`` (repeatable),
    at most one of them (docs/decoding.md "Constrained decoding")."""
    given = [n for n in CONSTRAINT_FLAGS if getattr(args, n, None)]
    if not given:
        return None
    if len(given) > 1:
        raise ValueError(f"give one of --regex, --json-schema, --choice, not {' and '.join('--' + n.replace('_', '-') for n in given)}")
    from .decoding import constraint as c

    if args.regex:
        return c.regex(args.regex)
    if args.choice:
        return c.choice(args.choice)
    schema = args.json_schema
    if not schema.lstrip().startswith("{"):  # a file
        schema = _read_utf8(schema)
    try:
        return c.json_schema(schema)
    except ValueError as e:
        raise ValueError(f"--json-schema: {str(e).removeprefix('json_schema: ')}") from None


# ---------------------------------------------------------------------------------------------------------
# eval
# ---------------------------------------------------------------------------------------------------------


TASKS = ("likelihood", "reasoning", "infill", "parallel")
_DECODING = ("reasoning", "infill", "parallel")
# flag -> the tasks it applies to (flags left at their default apply anywhere); the decoding settings apply
# to the decoding tasks, those of generate only (the budget, EOS stop, stop strings, cache order) to those
# that generate (reasoning and the parallel suite)
_TASK_FLAGS = {"level": ("reasoning",), "split": _DECODING, "n": _DECODING, "hidden": ("infill",), "eos": ("infill",),
               "predictions": _DECODING, "bf16": ("likelihood",), "clock": _DECODING,
               **{name: ("reasoning", "parallel") if name in GENERATE_ONLY else _DECODING for name in SETTINGS}}


def _check_task_flags(args) -> DecodeSettings:
    """Flags given for another task, or contradicting each other: one-line errors before any loading.
    Returns the decoding settings of the flags."""
    for name, tasks in _TASK_FLAGS.items():
        if getattr(args, name, None) not in (None, False) and args.task not in tasks:
            raise ValueError(f"--{name.replace('_', '-')} applies to --task {'/'.join(tasks)}, not {args.task}")
    settings = _decode_settings(args)
    if args.task == "reasoning" and args.data is not None:
        for name in ("level", "split"):
            if getattr(args, name) is not None:
                raise ValueError(f"--{name} applies to generated problems; --data {args.data} is a GSM8K file")
    return settings


def _eval(args) -> int:
    """Evaluate a checkpoint: likelihood bound, reasoning accuracy or infilling ROUGE (JSON on stdout)."""
    from .bench import evaluate_checkpoint

    settings = _check_task_flags(args)
    _check_output(args)
    result = evaluate_checkpoint(args.checkpoint, args.task, settings, **_task_args(args),
                                 batch_size=args.batch_size, bf16=args.bf16, predictions=args.predictions)
    line = json.dumps(result)
    if args.output:
        write_text(args.output, line + "\n")
    print(line)
    return 0


def _task_args(args) -> dict:
    """The task flags shared by ``eval`` and ``bench``, as keywords of setdlm.bench.evaluate_checkpoint /
    bench_checkpoints."""
    return {k: getattr(args, k) for k in ("data", "level", "split", "n", "hidden", "eos", "clock", "seed", "ema",
                                          "device", "quantize")}


def _add_task_flags(p, *, settings: tuple[str, ...], task_default: str | None) -> None:
    """Flags that pick the task's examples, and the decoding ``settings`` (fields of DecodeSettings) offered."""
    from .data.tasks import PRESETS, SPLITS

    p.add_argument("--task", choices=TASKS, default=task_default, required=task_default is None,
                   help="what to measure" + (f" (default {task_default})" if task_default else ""))
    p.add_argument("--data", default=None, help="likelihood: text source (default: the run's held-out rows); "
                   "reasoning: GSM8K-format JSONL (default: generated problems); infill: a text file, folder or "
                   "built-in corpus (default: shakespeare)")
    p.add_argument("--level", choices=tuple(PRESETS), default=None, help="reasoning: difficulty of the "
                   "generated problems (default medium)")
    p.add_argument("--split", choices=SPLITS, default=None, help="reasoning/infill/parallel: split drawn from "
                   "(default test)")
    p.add_argument("--n", type=_positive_int, default=None, help="reasoning/infill/parallel: examples (default 200 "
                   "problems or parallel-suite examples, or every infilling window that fits the context)")
    p.add_argument("--hidden", type=int, choices=(1, 3), default=None, help="infill: hidden sentences of 5 "
                   "(default 1)")
    p.add_argument("--eos", action="store_true", help="infill: EOS after the suffix (each window a whole document)")
    p.add_argument("--clock", choices=("wall", "cpu"), default=None, help="decoding tasks: time decoding by "
                   "wall clock (default, the paper's) or by CPU time (steady on a shared CPU)")
    notes = {name: "/".join(_TASK_FLAGS[name]) + ": " for name in settings}
    notes["max_new_tokens"] = "reasoning/parallel (default: what the longest prompt leaves of L): "
    notes["cache_order"] = "reasoning/parallel (the paper's GSM8K runs: reveal): "
    _add_settings_flags(p, settings, notes=notes)
    p.set_defaults(**{name: None for name in SETTINGS if name not in settings})


def _add_eval(sub) -> None:
    p = sub.add_parser("eval", help=_eval.__doc__.splitlines()[0])
    p.add_argument("checkpoint", help="checkpoint folder or training run folder")
    _add_task_flags(p, settings=SETTINGS, task_default="likelihood")
    p.add_argument("--batch-size", type=_positive_int, default=None, help="rows per batch (likelihood default: "
                   "the run's; decoding default 32)")
    p.add_argument("--seed", type=int, default=None, help="likelihood: seed of the random orders/masks (default: "
                   "the run's); reasoning/infill: seed of the example draw and of sampling (default 0)")
    p.add_argument("--ema", action="store_true", help="evaluate the EMA weights")
    p.add_argument("--bf16", action="store_true", help="likelihood: bf16 autocast (default: as trained)")
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N")
    _add_quantize_flag(p)
    p.add_argument("--output", default=None, help="also write the result as JSON to this file")
    p.add_argument("--predictions", default=None, help="reasoning/infill: write each example's prediction "
                   "to this JSONL file")
    p.set_defaults(func=_eval)


# ---------------------------------------------------------------------------------------------------------
# bench
# ---------------------------------------------------------------------------------------------------------


def _list_of(kind, what: str):
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


def _bench(args) -> int:
    """Sweep decoding settings over checkpoints: Markdown table, Pareto plot (PNG) and raw numbers (JSON)."""
    from .bench import bench_checkpoints

    settings = _check_task_flags(args)
    run = bench_checkpoints(args.checkpoints, args.task, args.out, settings, title=args.title,
                            thresholds=args.thresholds, windows=args.windows, batch_sizes=args.batch_sizes,
                            block_sizes=args.block_sizes, warmup=args.warmup, speculate=args.sweep_speculate,
                            **_task_args(args))
    print(run.table, end="")
    print(f"wrote {', '.join(map(str, run.files))}", file=sys.stderr)
    return 0


def _add_bench(sub) -> None:
    p = sub.add_parser("bench", help=_bench.__doc__.splitlines()[0], description=_bench.__doc__)
    p.add_argument("checkpoints", nargs="+", help="checkpoint or training run folders (one curve each)")
    swept = ("threshold", "window", "block_size", "speculate")  # setdlm.bench.SWEPT + speculate (not imported here: it loads torch)
    _add_task_flags(p, settings=tuple(k for k in SETTINGS if k not in swept), task_default=None)
    p.add_argument("--out", required=True, help="folder for bench.md, bench.json and bench.png")
    p.add_argument("--title", default=None, help="title of the plot (default: the task)")
    p.add_argument("--thresholds", type=_list_of(float, "--thresholds"), default=None,
                   help="comma-separated tau values, 'off' for none (default off,.99,.95,.9,.85,.8,.75,.7,.65,.6)")
    p.add_argument("--windows", type=_list_of(int, "--windows"), default=None,
                   help="setdlm: comma-separated windows w, 'D' for the model's D (default D)")
    p.add_argument("--speculate", dest="sweep_speculate", action="store_true", help="setdlm: also run each window w > 1 as lossless "
                   "self-speculative decoding (the output of w = 1, threshold off)")
    p.add_argument("--block-sizes", type=_list_of(int, "--block-sizes"), default=None,
                   help="bd3lm/mdlm: comma-separated decoding block sizes, 'D' for the model's own S (default D)")
    p.add_argument("--batch-sizes", type=_list_of(int, "--batch-sizes"), default=None,
                   help="comma-separated rows per call (default 1: per-example tokens/s, the paper's number)")
    p.add_argument("--warmup", type=int, default=None, help="examples timed but not counted in tokens/s "
                   "(default 50, the paper's, at most a quarter of the examples)")
    p.add_argument("--seed", type=int, default=None, help="seed of the example draw and of sampling (default 0)")
    p.add_argument("--ema", action="store_true", help="use the EMA weights")
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N")
    _add_quantize_flag(p)
    p.set_defaults(func=_bench, batch_size=None, bf16=False, predictions=None)


# ---------------------------------------------------------------------------------------------------------
# generate / infill
# ---------------------------------------------------------------------------------------------------------

def _add_decoding_flags(p, exclude: tuple[str, ...] = (), defaults: dict | None = None) -> None:
    """The checkpoint, one flag per decoding setting (bar ``exclude``) and the call's own flags."""
    p.add_argument("checkpoint", nargs="?", default=None,
                   help="checkpoint folder, training run folder or shipped model name "
                        "(default: the shipped shakespeare-setdlm-smax8)")
    _add_settings_flags(p, tuple(n for n in SETTINGS if n not in exclude), defaults=defaults)
    p.add_argument("--regex", default=None, help="the output must match this regular expression")
    p.add_argument("--json-schema", default=None, metavar="SCHEMA",
                   help="the output must be JSON valid against this JSON Schema (inline JSON or a file)")
    p.add_argument("--choice", action="append", default=None, help="the output must be one of these (repeatable)")
    p.add_argument("--seed", type=int, default=0, help="sampling seed")
    p.add_argument("--ema", action="store_true", help="decode with the EMA weights")
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N")
    _add_quantize_flag(p)
    p.add_argument("--output", default=None, help="write JSONL results here instead of printing texts")


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


def _report(out, rows: list[dict], args, shown: list[str] | None = None) -> int:
    print(f"nfe={out.nfe} tokens/step={out.tokens_per_step:.3f} seconds={out.seconds:.3f} "
          f"tokens/s={out.tokens_per_second:.1f}", file=sys.stderr)
    if args.output:
        text = "".join(json.dumps(r) + "\n" for r in rows)
        try:
            write_text(args.output, text)
        except ValueError:  # the write failed after decoding: the rows go to stdout, then the one-line error
            print(text, end="")
            raise
    else:
        print("\n\n".join(shown if shown is not None else [r["text"] for r in rows]))
    return 0


def _check_output(args) -> None:
    from .outputs import check_file

    if args.output is not None:
        check_file(args.output)


def _generate(args) -> int:
    """Decode continuations of prompts (arguments, a file or stdin) with the family's decoder."""
    from .loading import load

    _decode_settings(args)  # every value checked before loading; the family's settings after
    _check_output(args)
    prompts = _read_prompts(args)
    model = load(args.checkpoint or pretrained_default(), ema=args.ema, device=args.device, quantize=args.quantize)
    settings = _decode_settings(args, model.family.family)
    texts = prompts
    if args.chat:  # each prompt is one user message, rendered by the model's chat template (ids, no extra BOS)
        from .chat import chat_prompt

        prompts = [chat_prompt(model.tokenizer, p) for p in prompts]
    L = model.family.length
    for i, p in enumerate(prompts):  # the command's rule: a prompt leaves room for one new token at least
        n = len(p) if isinstance(p, list) else len(encode_prompt(model.tokenizer, p))
        if n >= L:
            raise ValueError(f"prompt {i} is {n} tokens long, which leaves no room in the context length L={L}")
    from .decoding import generate

    traced = bool(args.show_order or args.trace)
    out = generate(model, prompts, settings, seed=args.seed, trace=traced, progress=True)
    rows = [{"prompt": p, "text": t, "tokens": [int(x) for x in ids]} for p, t, ids in zip(texts, out.texts, out.tokens)]
    shown = _decode_order(model, out, rows, args) if traced else None
    return _report(out, rows, args, shown)


def _decode_order(model, out, rows: list[dict], args) -> list[str] | None:
    """``--trace FILE.json``: every row's per-step committed sets; ``--show-order``: each row's text with
    every token marked by the step that decided it, to print (docs/serve.md)."""
    from .decoding.output import step_record

    tok = model.tokenizer
    for i, row in enumerate(rows):
        start = len(out.sequences[i]) - len(out.tokens[i])
        row["steps"] = [step_record(t, k, start, tok) for k, t in enumerate(out.trace[i])]
    if args.trace:
        write_text(args.trace, json.dumps(rows) + "\n")
    if not args.show_order:
        return None
    colour = sys.stdout.isatty()
    if colour:
        print("colour = step that decided the token (blue: first, red: last)", file=sys.stderr)
    return [_order_text(tok, r, colour) for r in rows]


_STEP_COLOURS = [21, 27, 33, 39, 45, 51, 50, 48, 46, 82, 118, 154, 190, 226, 220, 214, 208, 202, 196]


def _order_text(tok, row: dict, colour: bool) -> str:
    """The generated tokens left to right, each coloured by its step (ANSI background) or, when the output
    is not a terminal, preceded by a plain marker ``[step]``. An ending EOS is left out."""
    step_of = {p: s["step"] for s in row["steps"] for p in s["positions"]}
    n_steps = max(len(row["steps"]), 1)
    eos = getattr(tok, "eos_token_id", None)
    parts = []
    for j, t in enumerate(row["tokens"]):
        if t == eos and j == len(row["tokens"]) - 1:
            break
        text, k = tok.decode([t]), step_of.get(j, 0)
        if colour:
            c = _STEP_COLOURS[round(k * (len(_STEP_COLOURS) - 1) / max(n_steps - 1, 1))]
            parts.append(f"\x1b[30;48;5;{c}m{text}\x1b[0m")
        else:
            parts.append(f"[{k}]{text}")
    return "".join(parts)


def _add_generate(sub) -> None:
    p = sub.add_parser("generate", help=_generate.__doc__.splitlines()[0])
    _add_decoding_flags(p, defaults={"max_new_tokens": 128})
    p.add_argument("--prompt", action="append", help="a prompt (repeatable; \"\" for unconditional)")
    p.add_argument("--input", default=None, help="prompts, one per line (or .jsonl with 'prompt'); - for stdin")
    p.add_argument("--show-order", action="store_true", help="print each token coloured by the step that decided "
                   "it (plain [step] markers when the output is not a terminal)")
    p.add_argument("--trace", default=None, metavar="FILE.json", help="write every step's committed set (positions, "
                   "token ids, tokens, confidences) of each prompt as JSON")
    p.add_argument("--chat", action="store_true", help="send each prompt as a user message through the model's "
                                                        "chat template")
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
    from .loading import load

    _decode_settings(args)  # every value checked before loading; the family's settings after
    _check_output(args)
    rows = _read_infill(args)
    model = load(args.checkpoint or pretrained_default(), ema=args.ema, device=args.device, quantize=args.quantize)
    settings = _decode_settings(args, model.family.family)
    from .decoding import infill

    out = infill(model, [r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows], settings=settings,
                 seed=args.seed, progress=True)
    res = [{"prefix": p, "suffix": s, "length": n, "text": t, "tokens": [int(x) for x in ids]}
           for (p, s, n), t, ids in zip(rows, out.texts, out.tokens)]
    return _report(out, res, args)


def _add_infill(sub) -> None:
    p = sub.add_parser("infill", help=_infill.__doc__.splitlines()[0])
    _add_decoding_flags(p, exclude=("max_new_tokens",) + GENERATE_ONLY)
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


def _serve(args) -> int:
    """Serve a model over an OpenAI-compatible HTTP API with set streaming, continuous batching and a live
    decode-order page at / (needs the extra setdlm[serve]; docs/serve.md)."""
    from .serve import serve

    for flag, v, lo in (("--port", args.port, 0), ("--max-batch", args.max_batch, 1), ("--max-queue", args.max_queue, 0)):
        if v < lo:
            raise ValueError(f"{flag} must be >= {lo}, got {v}")
    if not args.timeout > 0:
        raise ValueError(f"--timeout must be > 0 seconds, got {args.timeout}")
    if not args.max_body_mb > 0 or not args.grace >= 0:
        raise ValueError(f"--max-body-mb must be > 0 and --grace >= 0, got {args.max_body_mb}, {args.grace}")
    serve(args.model, host=args.host, port=args.port, max_batch=args.max_batch, max_queue=args.max_queue,
          timeout=args.timeout, device=args.device, name=args.name, max_body=int(args.max_body_mb * 2**20),
          allow_hosts=tuple(args.allow_host), grace=args.grace, quantize=args.quantize)
    return 0


def _add_serve(sub) -> None:
    p = sub.add_parser("serve", help=_serve.__doc__.splitlines()[0], description=_serve.__doc__)
    p.add_argument("model", nargs="?", default=None, help="checkpoint folder, training run folder or shipped model "
                   "name (default: the shipped shakespeare-setdlm-smax8)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="port (default 8000)")
    p.add_argument("--max-batch", type=int, default=16, help="rows decoded together at most (default 16)")
    p.add_argument("--max-queue", type=int, default=64, help="requests waiting for a free row at most; more get "
                   "429; 0: none wait (default 64)")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds a request may take (default 300)")
    p.add_argument("--max-body-mb", type=float, default=4.0, help="request body limit in MiB; more gets 413 "
                   "(default 4)")
    p.add_argument("--allow-host", action="append", default=[], metavar="NAME", help="on loopback, also answer "
                   "this Host header name (default: 127.0.0.1, localhost, ::1 only; repeatable)")
    p.add_argument("--grace", type=float, default=30.0, help="on SIGTERM/Ctrl-C, seconds requests in flight get "
                   "to finish before the server exits (default 30)")
    p.add_argument("--name", default=None, help="model id in the API (default: the folder name)")
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N")
    _add_quantize_flag(p)
    p.set_defaults(func=lambda args: _serve(_default_model(args)))


def _add_quantize_flag(p) -> None:
    from .quantize import QUANTIZATIONS

    p.add_argument("--quantize", choices=QUANTIZATIONS, default=None, help="decode with int8 or int4 weights on "
                   "the CPU, or a GGUF file's own (gguf) (docs/quantization.md; default: the stored precision)")


def _default_model(args):
    if args.model is None:
        from .pretrained import DEFAULT

        args.model = DEFAULT
    return args


def pretrained_default() -> str:
    """The shipped SetDLM model's folder (generate/infill without a checkpoint)."""
    from .pretrained import DEFAULT, path

    return str(path(DEFAULT))


def _demo(args) -> int:
    """Show the shipped models: Shakespeare, an infilled line, a solved problem, a live speed table, a plot."""
    from .demo import run_demo

    run_demo(args.models, out=args.out, n=args.n, max_new_tokens=args.max_new_tokens, progress=not args.quiet)
    return 0


def _add_demo(sub) -> None:
    p = sub.add_parser("demo", help=_demo.__doc__.splitlines()[0], description=_demo.__doc__)
    p.add_argument("--models", default=None, help="folder of checkpoints named like the shipped ones "
                   "(default: the shipped models)")
    p.add_argument("--out", default="demo", help="folder for the plot (default: demo)")
    p.add_argument("--n", type=int, default=24, help="problems in the live table (default 24)")
    p.add_argument("--max-new-tokens", type=int, default=48, help="length of the Shakespeare continuation")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.set_defaults(func=_demo)


COMMANDS = [_add_train, _add_eval, _add_bench, _add_generate, _add_infill, _add_schedule, _add_convert, _add_demo,
            _add_serve]


def build_parser() -> argparse.ArgumentParser:
    from . import __version__

    parser = Parser(prog="setdlm", description="Set diffusion language models.")
    parser.add_argument("--version", action="version", version=f"setdlm {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add in COMMANDS:
        add(sub)
    return parser


def _interrupted(args, e: KeyboardInterrupt) -> str:
    """What a Ctrl-C leaves behind, in a few words (decoding: the texts of the rows done go to stdout)."""
    from .decoding.api import DecodingInterrupted

    if isinstance(e, DecodingInterrupted) and args.command in ("generate", "infill"):
        for i in sorted(e.tokens):
            print(json.dumps({"row": i, "text": e.texts[i] if e.texts else None, "tokens": e.tokens[i]}))
        return f"{e}; {'their rows are above (JSONL on stdout)' if e.tokens else 'nothing was printed or written'}"
    if args.command == "train":
        from .train import interrupted_note

        return interrupted_note(args.out)
    return "nothing was written"


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return run(args.command, lambda: args.func(args), lambda e: _interrupted(args, e))


if __name__ == "__main__":
    sys.exit(main())
