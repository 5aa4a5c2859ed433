"""The ``setdlm`` command line: it parses and prints; each command builds its typed options and makes one
library call.

Every subcommand is registered in ``COMMANDS`` below; ``setdlm --help`` lists them:

* ``train``    — :func:`setdlm.training.train` (flags = the fields of :class:`setdlm.training.TrainConfig`)
* ``export``   — :func:`setdlm.training.consolidate`: an FSDP run's shards → single-file weights
* ``eval``     — :func:`setdlm.evaluation.evaluate_checkpoint` on a :class:`~setdlm.evaluation.TaskSpec`: a
  checkpoint's likelihood bound, reasoning accuracy or infilling ROUGE
* ``bench``    — :func:`setdlm.evaluation.bench_checkpoints`: speed/quality sweeps (:mod:`setdlm.evaluation.sweeps`)
* ``generate`` — :func:`setdlm.cli.options.generate_rows` (:func:`setdlm.decoding.generate`) on prompts from
  arguments, a file or stdin
* ``infill``   — :func:`setdlm.cli.options.infill_rows` (:func:`setdlm.decoding.infill`)
* ``schedule`` — print the position-offset schedule for (L, D, M)
* ``convert``  — :func:`setdlm.formats.convert.convert_reference`: the authors' checkpoints → a setdlm checkpoint
* ``demo``     — :func:`setdlm.cli.demo.run_demo`: the shipped models at work (what `make demo` runs)
* ``serve``    — :func:`setdlm.serve.serve`: an OpenAI-compatible server with continuous batching

The decoding and task flags are derived from :class:`~setdlm.decoding.settings.DecodeSettings` and
:class:`~setdlm.evaluation.TaskSpec` (:mod:`setdlm.cli.flags`). The checks live in the library and run before
any work: bad input is a :class:`setdlm.errors.UserError`, printed as one line naming the flag, exit code
2 (:mod:`setdlm.cli.command`); anything else is a bug and shows its traceback. Ctrl-C exits with code 130 and
one line saying what is left. The table of errors: docs/errors.md.
"""

from __future__ import annotations

import argparse
import json
import re
import sys

from .. import __version__
from ..data.inputs import read_infill_rows, read_prompts
from ..decoding.api import DecodingInterrupted
from ..decoding.output import order_text
from ..decoding.settings import GENERATE_ONLY, MAX_NEW_TOKENS
from ..evaluation.sweeps import SWEPT
from ..formats import pretrained
from ..formats.convert import convert_reference, describe
from ..formats.quantize import QUANTIZATIONS
from ..outputs import write_text
from ..schedules import StaggeredSchedule
from ..serve import ServeOptions, serve
from ..training import interrupted_note
from .chat import add_conversation_commands
from .listing import list_models
from .command import Parser, add_threads_flag, positional_model, run, set_threads
from .demo import run_demo
from .flags import (SETTINGS, add_dtype_flag, add_model_flags, add_settings_flags, add_task_flags, applies_to,
                    decode_settings, list_of, positive_int, task_spec)
from .options import GenerateOptions, InfillOptions, ModelChoice, generate_rows, infill_rows
from .train import add_train_commands
from ..evaluation import evaluate_checkpoint
from ..outputs import check_file
from ..evaluation import BenchSpec, EvalRun, LoadOptions, bench_checkpoints


# ---------------------------------------------------------------------------------------------------------
# schedule, train, export
# ---------------------------------------------------------------------------------------------------------

def summary(func) -> str:
    """The first sentence of a command's docstring, whole (the one-line help of ``setdlm --help``)."""
    text = " ".join(func.__doc__.split())
    end = re.search(r"\.(\s|$)", text)
    return text[: end.start() + 1] if end else text

def _schedule(args) -> int:
    """Print the position-offset schedule for (L, D, M): b, k, spacing, expected active tokens."""
    s = StaggeredSchedule.from_dm(args.L, args.D, args.M)
    print(f"L={s.L} D={s.D} M={s.M}  b={s.b:.7g}  k={s.k:.7g}  b/spacing={s.b / s.spacing:.6g}  "
          f"expected active tokens C={s.budget:.6g}")
    return 0


def _add_schedule(sub) -> None:
    p = sub.add_parser("schedule", help=summary(_schedule))
    p.add_argument("--L", type=int, required=True, help="context length")
    p.add_argument("--D", type=int, required=True, help="target parallelism (matched BD3LM block size)")
    p.add_argument("--M", type=int, default=None, help="max set size (default 2D)")
    p.set_defaults(func=_schedule)


def _add_train(sub) -> None:
    add_train_commands(sub, summary)  # train, export


# ---------------------------------------------------------------------------------------------------------
# eval, bench: a TaskSpec and the decoding settings, then setdlm.evaluation
# ---------------------------------------------------------------------------------------------------------


def _eval(args) -> int:
    """Evaluate a checkpoint: likelihood bound, reasoning accuracy or infilling ROUGE (JSON on stdout)."""

    settings, spec = decode_settings(args), task_spec(args)
    if args.output is not None:
        check_file(args.output)
    run = EvalRun(batch_size=args.batch_size, clock=args.clock)
    result = evaluate_checkpoint(args.checkpoint, spec, settings, run, bf16=args.bf16, predictions=args.predictions,
                                 load=_load_options(args))
    line = json.dumps(result)
    if args.output:
        write_text(args.output, line + "\n")
    print(line)
    return 0


def _add_eval(sub) -> None:
    p = sub.add_parser("eval", help=summary(_eval))
    p.add_argument("checkpoint", help="checkpoint folder or training run folder")
    add_task_flags(p, settings=SETTINGS, task_default="likelihood")
    p.add_argument("--batch-size", type=positive_int, default=None, help="rows per batch (likelihood default: "
                   "the run's; decoding default 32)")
    p.add_argument("--seed", type=int, default=None, help="likelihood: seed of the random orders/masks (default: "
                   "the run's); decoding tasks: seed of the example draw and of sampling (default 0)")
    p.add_argument("--bf16", action="store_true", help=applies_to("bf16", "options") + "bf16 autocast (default: as "
                   "trained)")
    add_model_flags(p, "evaluate")
    p.add_argument("--output", default=None, help="also write the result as JSON to this file")
    p.add_argument("--predictions", default=None, help=applies_to("predictions", "options") + "write each example's "
                   "prediction to this JSONL file")
    p.set_defaults(func=_eval)


def _bench(args) -> int:
    """Sweep decoding settings over checkpoints: Markdown table, Pareto plot (PNG) and raw numbers (JSON)."""

    settings, spec = decode_settings(args), task_spec(args)
    bench = BenchSpec(thresholds=args.thresholds, windows=args.windows, batch_sizes=args.batch_sizes,
                      block_sizes=args.block_sizes, warmup=args.warmup, sweep_speculate=args.sweep_speculate,
                      clock=args.clock, title=args.title)
    run = bench_checkpoints(args.checkpoints, spec, args.out, settings, bench, load=_load_options(args))
    print(run.table, end="")
    print(f"wrote {', '.join(map(str, run.files))}", file=sys.stderr)
    return 0


def _load_options(args) -> LoadOptions:
    return LoadOptions(ema=args.ema, device=args.device, dtype=args.dtype, quantize=args.quantize)


def _add_bench(sub) -> None:
    p = sub.add_parser("bench", help=summary(_bench), description=_bench.__doc__)
    p.add_argument("checkpoints", nargs="+", help="checkpoint or training run folders (one curve each)")
    swept = (*SWEPT, "speculate")
    add_task_flags(p, settings=tuple(k for k in SETTINGS if k not in swept), task_default=None)
    p.add_argument("--out", required=True, help="folder for bench.md, bench.json and bench.png")
    p.add_argument("--title", default=None, help="title of the plot (default: the task)")
    p.add_argument("--thresholds", type=list_of(float, "--thresholds"), default=None,
                   help="comma-separated tau values, 'off' for none (default off,.99,.95,.9,.85,.8,.75,.7,.65,.6)")
    p.add_argument("--windows", type=list_of(int, "--windows"), default=None,
                   help="setdlm: comma-separated windows w, 'D' for the model's D (default D)")
    p.add_argument("--sweep-speculate", action="store_true", help="setdlm: also run each window w > 1 as lossless "
                   "self-speculative decoding (the output of w = 1, threshold off)")
    p.add_argument("--block-sizes", type=list_of(int, "--block-sizes"), default=None,
                   help="bd3lm/mdlm: comma-separated decoding block sizes, 'D' for the model's own S (default D)")
    p.add_argument("--batch-sizes", type=list_of(int, "--batch-sizes"), default=None,
                   help="comma-separated rows per call (default 1: per-example tokens/s, the paper's number)")
    p.add_argument("--warmup", type=int, default=None, help="examples timed but not counted in tokens/s "
                   "(default 50, the paper's, at most a quarter of the examples)")
    p.add_argument("--seed", type=int, default=None, help="seed of the example draw and of sampling (default 0)")
    add_model_flags(p, "use", several_dtypes=True)
    p.set_defaults(func=_bench)


# ---------------------------------------------------------------------------------------------------------
# generate / infill: GenerateOptions / InfillOptions, then setdlm.cli.options
# ---------------------------------------------------------------------------------------------------------

def _add_decoding_flags(p, exclude: tuple[str, ...] = (), notes: dict | None = None) -> None:
    """The checkpoint, one flag per decoding setting (bar ``exclude``) and the call's own flags."""
    p.add_argument("checkpoint", nargs="?", default=None,
                   help="checkpoint folder, training run folder or shipped model name "
                        "(default: the shipped shakespeare-setdlm-smax8)")
    add_settings_flags(p, tuple(n for n in SETTINGS if n not in exclude), notes=notes)
    p.add_argument("--regex", default=None, help="the output must match this regular expression")
    p.add_argument("--json-schema", default=None, metavar="SCHEMA",
                   help="the output must be JSON valid against this JSON Schema (inline JSON or a file)")
    p.add_argument("--choice", action="append", default=None, help="the output must be one of these (repeatable)")
    p.add_argument("--seed", type=int, default=0, help="sampling seed")
    add_model_flags(p)
    p.add_argument("--output", default=None, help="write JSONL results here instead of printing texts")


def _model_choice(args, check: bool = True):
    if check:  # a switch's value or a mistyped local path: one line, before loading
        positional_model(args.checkpoint)
    return ModelChoice(args.checkpoint, ema=args.ema, device=args.device, quantize=args.quantize, dtype=args.dtype)


def _report(out, rows: list[dict], output: str | None, shown: list[str] | None = None) -> int:
    print(f"nfe={out.nfe} tokens/step={out.tokens_per_step:.3f} seconds={out.seconds:.3f} "
          f"tokens/s={out.tokens_per_second:.1f}", file=sys.stderr)
    if output:
        text = "".join(json.dumps(r) + "\n" for r in rows)
        try:
            write_text(output, text)
        except ValueError:  # the write failed after decoding: the rows go to stdout, then the one-line error
            print(text, end="")
            raise
    else:
        print("\n\n".join(shown if shown is not None else [r["text"] for r in rows]))
    return 0


def _generate(args) -> int:
    """Decode continuations of prompts (arguments, a file or stdin) with the family's decoder."""
    settings = decode_settings(args)  # every value checked before loading; the family's settings after
    opts = GenerateOptions(read_prompts(args.prompt, args.input), settings, _model_choice(args, False), seed=args.seed,
                           chat=args.chat, trace=args.trace, show_order=args.show_order, output=args.output)
    positional_model(args.checkpoint)  # after the output path's check, before loading
    out, rows, tok = generate_rows(opts)
    if args.trace:
        write_text(args.trace, json.dumps(rows) + "\n")
    shown = None
    if args.show_order:  # each token marked by the step that decided it (docs/serve.md)
        colour = sys.stdout.isatty()
        if colour:
            print("colour = step that decided the token (blue: first, red: last)", file=sys.stderr)
        shown = [order_text(r["tokens"], r["steps"], tok, colour) for r in rows]
    return _report(out, rows, args.output, shown)


def _add_generate(sub) -> None:
    p = sub.add_parser("generate", help=summary(_generate))
    _add_decoding_flags(p, notes={"max_new_tokens": f"default min({MAX_NEW_TOKENS}, what the prompt leaves of the "
                                                    "context): "})
    p.add_argument("--prompt", action="append", help="a prompt (repeatable; \"\" for unconditional)")
    p.add_argument("--input", default=None, help="prompts, one per line (or .jsonl with 'prompt'); - for stdin")
    p.add_argument("--show-order", action="store_true", help="print each token coloured by the step that decided "
                   "it (plain [step] markers when the output is not a terminal)")
    p.add_argument("--trace", default=None, metavar="FILE.json", help="write every step's committed set (positions, "
                   "token ids, tokens, confidences) of each prompt as JSON")
    p.add_argument("--chat", action="store_true", help="send each prompt as a user message through the model's "
                                                        "chat template")
    p.set_defaults(func=_generate)


def _infill(args) -> int:
    """Fill LENGTH tokens between a prefix and a suffix (SetDLM, BD3LM, MDLM; AR sees the prefix only)."""
    settings = decode_settings(args)  # every value checked before loading; the family's settings after
    rows = read_infill_rows(args.prefix, args.suffix, args.length, args.input)
    opts = InfillOptions(rows, settings, _model_choice(args, False), seed=args.seed, output=args.output)
    positional_model(args.checkpoint)  # after the output path's check, before loading
    out, res = infill_rows(opts)
    return _report(out, res, args.output)


def _add_infill(sub) -> None:
    p = sub.add_parser("infill", help=summary(_infill))
    _add_decoding_flags(p, exclude=("max_new_tokens",) + GENERATE_ONLY)
    p.add_argument("--prefix", default=None, help="text before the gap")
    p.add_argument("--suffix", default=None, help="text after the gap")
    p.add_argument("--length", type=int, default=None, help="tokens to fill")
    p.add_argument("--input", default=None, help="JSONL rows {prefix, suffix, length}; - for stdin")
    p.set_defaults(func=_infill)


# ---------------------------------------------------------------------------------------------------------
# convert, serve, demo
# ---------------------------------------------------------------------------------------------------------


def _convert(args) -> int:
    """Convert a checkpoint of the paper's authors (folder or Hub id) into a setdlm checkpoint folder."""
    out = convert_reference(args.from_reference, args.out, tokenizer=args.tokenizer, D=args.D, M=args.M,
                            base=args.base, dtype=args.dtype, revision=args.revision)
    print(f"wrote {out}: {describe(out)}")
    return 0


def _add_convert(sub) -> None:
    p = sub.add_parser("convert", help=summary(_convert), description=_convert.__doc__)
    p.add_argument("--from-reference", required=True, metavar="SRC",
                   help="folder or Hub id in the authors' layout, e.g. kuleshov-group/owt-setdlm-smax16")
    p.add_argument("out", help="the setdlm checkpoint folder to write")
    p.add_argument("--tokenizer", default=None, help="tokenizer folder or Hub name (default: the checkpoint's own, "
                   "else the dataset's: gpt2, bert-base-uncased, Qwen3)")
    p.add_argument("--D", type=int, default=None, help="override D (default: from the config or the name)")
    p.add_argument("--M", type=int, default=None, help="override M (default: min(2D, L), as the authors' loader)")
    p.add_argument("--base", default=None, help="Qwen3 checkpoints: folder or Hub id of the base model's config")
    p.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default=None,
                   help="cast the weights (default: as stored)")
    p.add_argument("--revision", default=None, help="Hub branch, tag or commit")
    p.set_defaults(func=_convert)


def _serve(args) -> int:
    """Serve a model over an OpenAI-compatible HTTP API with set streaming, continuous batching and a live
    decode-order page at / (needs the extra setdlm[serve]; docs/serve.md)."""
    options = ServeOptions(host=args.host, port=args.port, max_batch=args.max_batch, max_queue=args.max_queue,
                           timeout=args.timeout, max_body_mb=args.max_body_mb, allow_hosts=tuple(args.allow_hosts),
                           grace=args.grace, api_key=args.api_key)  # checked once: a bad value names its flag
    serve(args.model or pretrained.DEFAULT, options, device=args.device, name=args.name, quantize=args.quantize,
          dtype=args.dtype)
    return 0


def _add_serve(sub) -> None:
    p = sub.add_parser("serve", help=summary(_serve), description=_serve.__doc__)
    p.add_argument("model", nargs="?", default=None, help="checkpoint folder, training run folder or shipped model "
                   "name (default: the shipped shakespeare-setdlm-smax8)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="port (default 8000)")
    p.add_argument("--max-batch", type=int, default=16, help="rows decoded together at most (default 16)")
    p.add_argument("--max-queue", type=int, default=64, help="requests waiting for a free row at most; more get "
                   "429; 0: none wait (default 64)")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds a request may take (default 300)")
    p.add_argument("--max-body-mb", type=float, default=4.0, help="body limit in MiB, more gets 413 (default 4)")
    p.add_argument("--allow-host", "--allow-hosts", dest="allow_hosts", action="append", default=[], metavar="NAME",
                   help="on loopback, also answer this Host header name (default: 127.0.0.1, localhost, ::1 only; "
                   "repeatable)")
    p.add_argument("--grace", type=float, default=30.0, help="on SIGTERM, seconds requests in flight get (default 30)")
    p.add_argument("--api-key", default=None, metavar="KEY", help="requests to /v1/* must send 'Authorization: "
                   "Bearer KEY' (default: none, no authentication)")
    p.add_argument("--name", default=None, help="model id in the API (default: the folder name)")
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N")
    add_dtype_flag(p, "serve")
    p.add_argument("--quantize", choices=QUANTIZATIONS, default=None, help="serve int8 or int4 weights on the CPU, "
                   "or a GGUF file's own (gguf) (docs/quantization.md; default: the stored precision)")
    p.set_defaults(func=_serve)


def _add_conversation(sub) -> None:
    add_conversation_commands(sub, summary, _model_choice)  # run, chat


def _demo(args) -> int:
    """Show the shipped models: Shakespeare, an infilled line, a solved problem, a live speed table, a plot."""
    run_demo(args.models, out=args.out, n=args.n, max_new_tokens=args.max_new_tokens, progress=not args.quiet)
    return 0


def _add_demo(sub) -> None:
    p = sub.add_parser("demo", help=summary(_demo), description=_demo.__doc__)
    p.add_argument("--models", default=None, help="folder of checkpoints named like the shipped ones "
                   "(default: the shipped models)")
    p.add_argument("--out", default="demo", help="folder for the plot (default: demo)")
    p.add_argument("--n", type=int, default=24, help="problems in the live table (default 24)")
    p.add_argument("--max-new-tokens", type=positive_int, default=None, help="length of the Shakespeare "
                   f"continuation (default min({MAX_NEW_TOKENS}, what the prompt leaves of the context))")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.set_defaults(func=_demo)


def _add_models(sub) -> None:
    p = sub.add_parser("models", help=summary(list_models), description=list_models.__doc__)
    p.set_defaults(func=list_models)


COMMANDS = [_add_train, _add_eval, _add_bench, _add_generate, _add_infill, _add_conversation, _add_schedule,
            _add_convert, _add_demo, _add_serve, _add_models]


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="setdlm", description="Set diffusion language models.")
    parser.add_argument("--version", action="version", version=f"setdlm {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add in COMMANDS:
        add(sub)
    for p in sub.choices.values():  # every command: the CPU threads PyTorch uses
        add_threads_flag(p)
    return parser


def _interrupted(args, e: KeyboardInterrupt) -> str:
    """What a Ctrl-C leaves behind, in a few words (decoding: the texts of the rows done go to stdout)."""
    if isinstance(e, DecodingInterrupted) and args.command in ("generate", "infill"):
        for i in sorted(e.tokens):
            print(json.dumps({"row": i, "text": e.texts[i] if e.texts else None, "tokens": e.tokens[i]}))
        return f"{e}; {'their rows are above (JSONL on stdout)' if e.tokens else 'nothing was printed or written'}"
    if args.command == "export":
        return "a file being written is left under a temporary name"
    if args.command == "train":
        return interrupted_note(args.out)
    return "nothing was written"


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    set_threads(getattr(args, "threads", None))
    return run(args.command, lambda: args.func(args), lambda e: _interrupted(args, e))

