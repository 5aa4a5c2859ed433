"""Faster than AR at AR's accuracy? The shipped word-problem models decoded side by side on held-out problems,
every decode mode on one accuracy-vs-tokens/s frontier, at batch 1 and batch 32 (benchmarks/RESULTS.md,
"Faster than AR at AR's accuracy"; docs/decoding.md, "Self-speculative decoding").

    PYTHONPATH=src python benchmarks/speed_at_accuracy.py --out benchmarks/speed_at_accuracy   # RESULTS.md
    PYTHONPATH=src python benchmarks/speed_at_accuracy.py --n 64 --out /tmp/smoke                # a smoke run

Models: ``arith-ar``, ``arith-bd3lm-s4``, ``arith-setdlm-smax8`` (float32, greedy). Problems: the first ``--n``
of the built-in ``medium`` test split (drawn with ``--seed``), prompts as ``setdlm eval --task reasoning``
builds them, decoded until EOS. Modes: AR; BD3LM S=4 (τ off, τ 0.9); SetDLM w=1 (its most careful decode),
w=4 τ off and τ 0.9/0.95/0.99 (near-lossless: a stated accuracy cost), and the lossless self-speculative decode
(``speculate=True``: token for token the w=1 output) at windows ``--windows`` in both query layouts
(the setting ``verify_layout``: "all" horizons carry a window, or only the "last", the whole draft's).
Each batch size is one run in which every mode decodes one call in turn, the order rotated each round
(:func:`setdlm.evaluation.passes.interleave`), at ``--threads`` torch threads; speed is generated tokens per second of
this process's CPU time over the whole pass (``--clock cpu``, steady on a shared machine; ``wall`` also
offered), prompts' prefill included. ``--dtypes float32 bfloat16``: every mode in each precision (the weights cast
at load; labels of a precision other than float32 end in its tag, e.g. `` bf16``). Each mode's ratios are against
AR at its own best at the same batch size, on each axis: the highest accuracy and the highest speed of any AR row
(the shipped AR, with ``--distilled-ar`` the AR fine-tuned by the same recipe, in every precision run). ``--mixed-ar``
adds an AR that no library offers as a mode, to bound what AR could still gain: its prompts' prefill in bfloat16
(a bfloat16 copy of the weights writing the float32 cache), its steps in float32. A traced pass over the first 20
problems at batch 1 counts the positions each forward feeds per row.

Writes ``OUT/frontier.json`` (every number), ``OUT/frontier.md`` (the table) and ``OUT/frontier.png``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

import setdlm
from setdlm.data.tasks import reasoning_split
from setdlm.decoding import generate
from setdlm.evaluation.passes import EvalRun, interleave, prompt_ids
from setdlm.evaluation.reasoning import reasoning_steps

MODELS = {"AR": "arith-ar", "BD3LM S=4": "arith-bd3lm-s4", "SetDLM S<=8": "arith-setdlm-smax8"}
DISTILLED = "SetDLM S<=8 distilled"  # --distilled CHECKPOINT: arith-setdlm-smax8 fine-tuned on its own outputs
DISTILLED_AR = "AR fine-tuned"  # --distilled-ar CHECKPOINT: arith-ar fine-tuned by the same recipe as the SetDLM
AR_HEAD = "SetDLM+AR"  # --ar-head CHECKPOINT: a SetDLM trained with a next-token head (ar_weight > 0)
NAMES = dict(MODELS)  # model key -> what setdlm.load reads (MODELS, and the distilled checkpoint when given)
TAGS = {"float32": "", "bfloat16": " bf16", "float16": " fp16"}  # label suffix of each precision
MIXED = ", bf16 prefill"  # label suffix of --mixed-ar's mode: the prefill in bfloat16, the steps in float32


def modes(windows: list[int], distilled: bool = False, distilled_ar: bool = False, ar_head: bool = False,
          only: list[str] | None = None, mixed_ar: bool = False) -> list[tuple[str, str, dict, str | None]]:
    """(label, model key, decode settings, speculative layout) of every mode on the frontier; ``distilled``: also
    the self-distilled SetDLM's lossless speculative decode (benchmarks/self_distill.py) at each window;
    ``distilled_ar``: the AR model fine-tuned by the same recipe; ``ar_head``: the SetDLM trained with a
    next-token head, its AR decode (``speculate="next_token"``, w = 1) and its speculative decode verified by that head
    at each window; ``only``: keep the modes whose label contains one of these strings."""
    out = [("AR", "AR", {}, None)] + ([("AR fine-tuned", DISTILLED_AR, {}, None)] if distilled_ar else [])
    out += [("BD3LM τ off", "BD3LM S=4", {}, None),
            ("BD3LM τ 0.9", "BD3LM S=4", {"threshold": 0.9}, None),
            ("SetDLM w=1", "SetDLM S<=8", {"window": 1}, None), ("SetDLM w=4 τ off", "SetDLM S<=8", {}, None)]
    out += [(f"SetDLM w=4 τ {t}", "SetDLM S<=8", {"threshold": t}, None) for t in (0.99, 0.95, 0.9)]
    out += [(f"SetDLM speculate w={w} {layout}", "SetDLM S<=8",
             {"speculate": True, "window": w, "verify_layout": layout}, layout)
            for w in windows for layout in ("all", "last")]
    if distilled:
        out += [(f"SetDLM distilled speculate w={w} last", DISTILLED, {"speculate": True, "window": w}, "last")
                for w in windows]
    if ar_head:
        out += [(f"SetDLM+AR speculate=next_token w={w}", AR_HEAD, {"speculate": "next_token", "window": w}, None)
                for w in [1, *windows]]
    if mixed_ar:  # the most accurate AR with its prefill in bfloat16 (with_prefill_in)
        out.insert(1 + distilled_ar, (("AR fine-tuned" if distilled_ar else "AR") + MIXED,
                                      DISTILLED_AR if distilled_ar else "AR", {}, None))
    return [m for m in out if m[0] == "AR" or MIXED in m[0] or not only or any(o in m[0] for o in only)]


def in_precisions(plan: list[tuple[str, str, dict, str | None]], dtypes: list[str]) -> list[tuple]:
    """Every mode of ``plan`` in each of ``dtypes``: the label tagged (:data:`TAGS`), the model key
    ``KEY@DTYPE`` (float32: the key as it is)."""
    return [(label + TAGS[dt], key if dt == "float32" else f"{key}@{dt}", settings, layout)
            for dt in dtypes for label, key, settings, layout in plan if dt == "float32" or MIXED not in label]


def load_models(plan) -> dict:
    """The model of every key the plan decodes with (``KEY@DTYPE``: cast to that precision; ``KEY@prefill``: the
    bfloat16 backbone --mixed-ar's mode prefills with)."""
    keys = [m[1] for m in plan] + [f"{m[1]}@prefill" for m in plan if MIXED in m[0]]
    out = {}
    for key in dict.fromkeys(keys):
        base, _, dtype = key.partition("@")
        out[key] = setdlm.load(NAMES[base], dtype="bfloat16" if dtype == "prefill" else dtype or None)
    return out


def with_prefill_in(steps, backbone):
    """A pass whose AR decoder caches the prompts with ``backbone`` (another precision of the same weights)
    during each of its calls: the cache stays in the decoding model's dtype, only the prefill's forward changes."""
    from setdlm.decoding import ar

    original = ar.prefill_positions

    def prefill(_, st, take, block_size=None):
        original(backbone, st, take, block_size)

    while True:
        ar.prefill_positions = prefill
        try:
            next(steps)
        except StopIteration as done:
            return done.value
        finally:
            ar.prefill_positions = original
        yield


def positions_per_forward(model, examples, settings: dict) -> float:
    """Mean positions one row feeds per forward (its input slots), over a traced batch-1 pass."""
    fed = forwards = 0
    for e in examples:
        ids = prompt_ids(model, e)
        out = generate(model, [ids], trace=True, max_new_tokens=model.family.length - len(ids), **settings)
        fed += sum(len(s.input_positions) for s in out.trace[0])
        forwards += len(out.trace[0])
    return fed / forwards


def run_batch(models: dict, examples, batch: int, plan: list[tuple], clock: str) -> list[dict]:
    """Every mode of ``plan`` at one batch size, side by side; one dict per mode."""
    passes = [reasoning_steps(models[key], examples, None, EvalRun(batch_size=batch, clock=clock, progress=False),
                              **settings)
              for _, key, settings, _ in plan]
    passes = [with_prefill_in(p, models[f"{key}@prefill"].backbone) if MIXED in label else p
              for p, (label, key, _, _) in zip(passes, plan)]
    started = time.perf_counter()
    results = interleave(passes)
    print(f"batch {batch}: {len(plan)} modes side by side in {time.perf_counter() - started:.0f} s", flush=True)
    rows = []
    for (label, key, settings, layout), r in zip(plan, results):
        rows.append({"mode": label, "model": NAMES[key.partition("@")[0]], "dtype": models[key].dtype,
                     "settings": settings, "layout": layout, "batch": batch,
                     "accuracy": r.accuracy, "tokens": r.run.generated_tokens, "seconds": r.run.seconds,
                     "tokens_per_second": r.run.generated_tokens / r.run.seconds, "nfe": r.run.nfe,
                     "tokens_per_forward": r.run.tokens_per_step, "ms_per_forward": 1e3 * r.run.seconds / r.run.nfe})
    ar = baseline(rows)
    for x in rows:
        x["baseline"] = ar["mode"]
        x["baseline_accuracy"], x["baseline_tokens_per_second"] = ar["accuracy"], ar["tokens_per_second"]
        x["x_ar_accuracy"] = x["accuracy"] / ar["accuracy"]
        x["x_ar_speed"] = x["tokens_per_second"] / ar["tokens_per_second"]
    return rows


def baseline(rows: list[dict]) -> dict:
    """AR at its own best, on each axis, against which every ratio is taken: the highest accuracy of any AR row
    (shipped, or fine-tuned by the same recipe; any precision) and the highest speed of any AR row."""
    ars = [x for x in rows if x["mode"].split()[0] == "AR"]
    best = max(ars, key=lambda x: (x["accuracy"], x["tokens_per_second"]))
    fast = max(ars, key=lambda x: x["tokens_per_second"])
    mode = best["mode"] if fast is best else f"{best['mode']} (accuracy), {fast['mode']} (speed)"
    return {"mode": mode, "accuracy": best["accuracy"], "tokens_per_second": fast["tokens_per_second"]}


def table(rows: list[dict]) -> str:
    lines = ["| batch | mode | accuracy | × AR accuracy | tokens/s | × AR tok/s | tokens/forward | ms/forward | "
             "positions/forward (per row) |", "|---:|---|---:|---:|---:|---:|---:|---:|---:|"]
    for x in rows:
        pos = f"{x['positions_per_forward']:.1f}" if "positions_per_forward" in x else "–"
        lines.append(f"| {x['batch']} | {x['mode']} | {100 * x['accuracy']:.1f}% | {x['x_ar_accuracy']:.3f} | "
                     f"{x['tokens_per_second']:.0f} | {x['x_ar_speed']:.2f}x | {x['tokens_per_forward']:.2f} | "
                     f"{x['ms_per_forward']:.2f} | {pos} |")
    return "\n".join(lines) + "\n"


def plot(rows: list[dict], path: Path) -> None:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(12, 4.8))
    batches = sorted({x["batch"] for x in rows})
    for i, b in enumerate(batches):
        ax = fig.add_subplot(1, len(batches), i + 1)
        for j, x in enumerate(x for x in rows if x["batch"] == b):
            family = x["mode"].split()[0]
            marker = {"AR": "s", "BD3LM": "^", "SetDLM": "o", "SetDLM+AR": "D"}[family]
            color = "C3" if "speculate" in x["mode"] else {"AR": "k", "BD3LM": "C0", "SetDLM": "C2"}[family]
            color = "C4" if family == "SetDLM+AR" else color
            full = x.get("dtype", "float32") == "float32"  # other precisions: hollow markers
            ax.scatter(x["tokens_per_second"], 100 * x["accuracy"], marker=marker, color=color,
                       facecolors=color if full else "none")
            label = x["mode"].replace("SetDLM+AR speculate=next_token ", "next-token ")
            ax.annotate(label.replace("SetDLM ", "").replace("speculate ", "spec "), (x["tokens_per_second"],
                        100 * x["accuracy"]), fontsize=6, xytext=(3, 2 - 8 * (j % 4)), textcoords="offset points")
            # labels of neighbouring modes staggered downwards: points of one accuracy sit side by side
        ar = baseline([x for x in rows if x["batch"] == b])
        ax.axhline(97 * ar["accuracy"], color="grey", lw=0.6, ls="--")
        ax.axvline(ar["tokens_per_second"] * (2 if b == 1 else 1.5), color="grey", lw=0.6, ls=":")
        ax.set_xlabel("generated tokens per CPU-second")
        ax.set_ylabel("exact-match accuracy (%)")
        ax.set_title(f"batch {b} (dashed: 0.97x AR accuracy; dotted: the speed goal; hollow: bf16)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=600, help="held-out problems (default 600)")
    ap.add_argument("--seed", type=int, default=1, help="seed of the problems drawn from the test split")
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 32])
    ap.add_argument("--windows", type=int, nargs="+", default=[4, 5, 6], help="speculative windows")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--clock", choices=("cpu", "wall"), default="cpu")
    ap.add_argument("--distilled", default=None, help="a self-distilled SetDLM checkpoint to add "
                    "(benchmarks/self_distill.py)")
    ap.add_argument("--distilled-ar", default=None, help="arith-ar fine-tuned by the same recipe "
                    "(benchmarks/self_distill.py --model arith-ar); ratios are taken against the better AR")
    ap.add_argument("--ar-head", default=None, help="a SetDLM trained with a next-token head (setdlm train "
                    "--ar-weight 1): its AR decode and speculate='next_token' at each window")
    ap.add_argument("--only", nargs="+", default=None, help="keep the modes whose label contains one of these "
                    "(AR is always kept)")
    ap.add_argument("--dtypes", nargs="+", choices=tuple(TAGS), default=["float32"],
                    help="precisions every mode runs in (default float32)")
    ap.add_argument("--mixed-ar", action="store_true", help="add the most accurate AR with its prefill in bfloat16 "
                    "and its steps in float32 (a bound, not a mode of the library)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    if args.distilled:
        NAMES[DISTILLED] = args.distilled
    if args.distilled_ar:
        NAMES[DISTILLED_AR] = args.distilled_ar
    if args.ar_head:
        NAMES[AR_HEAD] = args.ar_head
    torch.set_num_threads(args.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    plan = in_precisions(modes(args.windows, bool(args.distilled), bool(args.distilled_ar), bool(args.ar_head),
                               args.only, args.mixed_ar), args.dtypes)
    models = load_models(plan)
    examples = reasoning_split("test", args.n, level="medium", seed=args.seed)
    positions = {label: positions_per_forward(models[key], examples[:20], settings)
                 for label, key, settings, _ in plan}
    rows = []
    for b in args.batch_sizes:
        rows += run_batch(models, examples, b, plan, args.clock)
    for x in rows:
        x["positions_per_forward"] = positions[x["mode"]]
    meta = {"distilled": args.distilled, "distilled_ar": args.distilled_ar, "ar_head": args.ar_head, "only": args.only,
            "dtypes": args.dtypes, "mixed_ar": args.mixed_ar,
            "n": args.n, "seed": args.seed, "threads": args.threads, "clock": args.clock, "torch": torch.__version__,
            "cpu_capability": torch.backends.cpu.get_cpu_capability()}
    (out / "frontier.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    (out / "frontier.md").write_text(table(rows))
    plot(rows, out / "frontier.png")
    print(table(rows))
    print(f"wrote {out / 'frontier.json'}, {out / 'frontier.md'}, {out / 'frontier.png'}")


if __name__ == "__main__":
    main()
