"""Why SetDLM trails AR at this size: where the fine-tuned models' answers go wrong (issue 22, item 2).

``python benchmarks/study/error_analysis.py [--root /work/runs/protocol] [--n 500] [--steps 1500] [--light]``

Every number is measured on the ``validation`` split of the ``medium`` word problems (never the test split),
greedy, with the checkpoints of the protocol's fine-tunes (``benchmarks/study/protocol.py``): the AR fine-tune
and SetDLM S<=8 (D = 4, M = 8), each at the given budgets (and at its newest checkpoint when that is past
them). SetDLM is decoded with the positional window ``w`` in 1, 2, 4 (= D), 8 (docs/method.md §4.2), the
confidence threshold off / 0.9 / 0.7 / 0.5 (§4.3), and with a threshold the cache in position or reveal order
(§4.5: the order of the tokens one step commits; with one token a step both orders are the same decode). For
every configuration, from the decoder's own step trace (``generate(..., trace=True)``):

* **where the first error is** (per-position error rates): each reference completion ``a op b=c`` lines then
  ``#### answer`` is cut into fields (``carry`` = the number carried from the previous line or the question,
  ``op``, ``operand`` = the number copied from the question, ``result`` = the computed number, the ``answer``
  after ``####``, punctuation, EOS). A row's *first divergence* is the first token that differs from the
  reference; its field, line and digit say what a wrong answer gets wrong first, and the *hazard* of a field
  is first divergences in it / its tokens reached with a correct prefix (a per-token error rate).
* **in-order vs gapped commits**: a commit is *gapped* when a position to its left was still masked at the
  forward that predicted it (it was decoded without its whole left context; w = 1 never gaps). Over the
  commits made while every earlier commit was right ("clean"), the error rate of in-order and of gapped commits.
* **the conditionals by gap**: at every clean forward, the top-1 candidate of each query position against the
  reference, by the number of masked positions to its left: how well the model predicts a token that is
  missing g tokens of its left context (the training objective's gapped conditionals, g = 0 is the AR one).

Writes ``results/error_analysis.json`` (every figure, per configuration) and ``results/error_analysis.md``.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

RESULTS = Path(__file__).parent / "results"
LEVEL = "medium"
LINE = re.compile(r"(\d+)([-+*/])(\d+)=(\d+)")
# (label, settings) of the SetDLM decodes; the default decode (w = D, position order, threshold off) second
SETDLM_DECODES = (("w=1", {"window": 1}), ("w=4 (D)", {}), ("w=2", {"window": 2}), ("w=8", {"window": 8}),
                  ("w=4, tau 0.9", {"threshold": 0.9}), ("w=4, tau 0.7", {"threshold": 0.7}),
                  ("w=4, tau 0.5", {"threshold": 0.5}),
                  # the cache order only matters when a step commits several tokens (docs/method.md §4.5)
                  ("w=4, tau 0.9, reveal order", {"threshold": 0.9, "cache_order": "reveal"}),
                  ("w=4, tau 0.5, reveal order", {"threshold": 0.5, "cache_order": "reveal"}))


@dataclass(frozen=True)
class Slot:
    """What one reference token is: its line (0-based; the ``####`` line is ``final``), its field, and for a
    digit its index from the left in a number of ``ndigits`` digits."""

    line: int | str
    field: str  # carry | op | operand | eq | result | newline | marker | answer | eos
    digit: int | None = None
    ndigits: int | None = None
    op: str | None = None  # the operation of a reasoning line


def slots(completion: str) -> list[Slot]:
    """One :class:`Slot` per character of a reference completion (``a op b=c`` lines, ``#### answer``), plus
    the EOS that ends it. A character tokenizer maps each character to one token."""
    out: list[Slot] = []
    lines = completion.split("\n")
    for k, line in enumerate(lines):
        if line.startswith("####"):
            num = line[5:]
            out += [Slot("final", "marker")] * 5 + [Slot("final", "answer", j, len(num)) for j in range(len(num))]
        else:
            m = LINE.fullmatch(line)
            if m is None:
                raise ValueError(f"not a solution line: {line!r}")
            a, op, b, c = m.groups()
            out += [Slot(k, "carry", j, len(a), op) for j in range(len(a))] + [Slot(k, "op", op=op)]
            out += [Slot(k, "operand", j, len(b), op) for j in range(len(b))] + [Slot(k, "eq", op=op)]
            out += [Slot(k, "result", j, len(c), op) for j in range(len(c))] + [Slot(k, "newline", op=op)]
    return out + [Slot("final", "eos")]


def first_divergence(pred: list[int], ref: list[int]) -> int | None:
    """Index of the first token of ``pred`` that differs from ``ref`` (``len(pred)`` if it stops short), or
    None when the two are equal."""
    for j, t in enumerate(ref):
        if j >= len(pred) or pred[j] != t:
            return j
    return None if len(pred) == len(ref) else len(ref)


def commits(trace: list, start: int, end: int, ref: list[int]) -> tuple[list[dict], list[dict]]:
    """Walk one row's step trace (its output spans positions ``[start, end)``, up to its EOS: what a step
    commits past it is not part of the answer). Returns its commits ``{"step", "gap", "clean", "right"}`` in
    time order
    (``gap``: positions left of it still masked at its forward; ``clean``: every earlier commit was right;
    ``right``: it equals the reference token) and, for the clean forwards, every query's
    ``{"gap", "right", "confidence"}`` (the top-1 candidate against the reference), each (position, gap) once:
    the first forward that asks it (a position the decoder passes over is asked again at the same gap, and
    counting every ask would weight the hard positions by how long they stay masked)."""
    committed: set[int] = set()
    asked: set[tuple[int, int]] = set()
    clean = True
    out, queries = [], []

    def gap(p: int) -> int:
        return sum(1 for q in range(start, p) if q not in committed)

    def right(p: int, t: int) -> bool:
        return p - start < len(ref) and ref[p - start] == t

    for s, st in enumerate(trace):
        for p, t, c in zip(st.query_positions, st.candidates, st.confidences) if clean else ():
            g = gap(p)
            if p < end and (p, g) not in asked:
                asked.add((p, g))
                queries.append({"gap": g, "right": right(p, t), "confidence": c})
        now = [{"step": s, "gap": gap(p), "clean": clean, "right": right(p, t)}
               for p, t in zip(st.committed_positions, st.committed_tokens) if p < end]
        out += now
        committed.update(st.committed_positions)
        clean = clean and all(c["right"] for c in now)
    return out, queries


def _rate(num: int, den: int) -> float | None:
    return num / den if den else None


def analyse(model, examples, settings: dict, *, batch_size: int, seed: int) -> dict:
    """Decode ``examples`` with ``settings`` (traced) and return every figure of one configuration."""
    from setdlm.evaluation.passes import prompt_ids
    from setdlm.data.tasks import extract_answer
    from setdlm.decoding import DecodeSettings, generate

    tok = model.tokenizer
    prompts = [prompt_ids(model, e) for e in examples]
    budget = model.family.length - max(map(len, prompts))  # as evaluation.reasoning: what the longest leaves
    ds = DecodeSettings(max_new_tokens=budget, **settings)
    eos = tok.eos_token_id
    n_right = n_forwards = n_committed = 0
    first_field, first_line, first_digit, first_gap = Counter(), Counter(), Counter(), Counter()
    reached, diverged = Counter(), Counter()  # field -> tokens reached with a right prefix / first divergences
    op_reached, op_diverged = Counter(), Counter()  # the same for the result digits, by the line's operation
    commit_stats = Counter()  # (kind, right) over clean commits; kind = in-order | gapped
    query_stats: dict[int, list[float]] = {}  # gap -> [n, right, confidence sum]
    n_commits = n_gapped = 0
    t0 = time.process_time()
    for lo in range(0, len(examples), batch_size):
        chunk = examples[lo:lo + batch_size]
        out = generate(model, prompts[lo:lo + batch_size], ds, seed=seed, trace=True)
        n_forwards += sum(out.row_nfe)
        n_committed += sum(out.row_committed)
        for e, p, pred, text, trace in zip(chunk, prompts[lo:lo + batch_size], out.tokens, out.texts, out.trace):
            ref = tok.encode(e.completion) + [eos]
            sl = slots(e.completion)
            if len(sl) != len(ref):
                raise ValueError("error_analysis needs a character tokenizer (one token per character)")
            ok = extract_answer(text) == e.answer
            n_right += ok
            cut = next((j for j, t in enumerate(pred) if t == eos), len(pred) - 1)
            d = first_divergence(pred[:cut + 1], ref)
            # tokens reached with a right prefix: all of a right row, a wrong row's up to its first error
            for j in range(len(ref) if d is None else d + (not ok)):
                reached[sl[j].field] += 1
                op_reached[sl[j].op] += sl[j].field == "result"
            row_commits, queries = commits(trace, len(p), len(p) + cut + 1, ref)
            for c in row_commits:
                n_commits += 1
                n_gapped += c["gap"] > 0
                if c["clean"]:
                    commit_stats[("gapped" if c["gap"] else "in-order", c["right"])] += 1
            for q in queries:
                s = query_stats.setdefault(q["gap"], [0, 0, 0.0])
                s[0], s[1], s[2] = s[0] + 1, s[1] + q["right"], s[2] + q["confidence"]
            if ok or d is None:
                continue
            slot = sl[d]
            diverged[slot.field] += 1
            op_diverged[slot.op] += slot.field == "result"
            first_field[slot.field] += 1
            first_line[str(slot.line)] += 1
            if slot.digit is not None:
                first_digit[f"{slot.field} digit {slot.digit + 1} of {slot.ndigits}"] += 1
            wrong = next((c for c in row_commits if c["clean"] and not c["right"]), None)
            first_gap["none" if wrong is None else str(wrong["gap"])] += 1
    n = len(examples)
    n_wrong = n - n_right
    reasoning = sum(v for k, v in first_line.items() if k != "final")
    clean_n = {k: commit_stats[(k, True)] + commit_stats[(k, False)] for k in ("in-order", "gapped")}
    return {
        "settings": settings, "n": n, "accuracy": n_right / n, "tokens_per_step": n_committed / max(n_forwards, 1),
        "nfe_per_example": n_forwards / n, "cpu_seconds": round(time.process_time() - t0, 1),
        "wrong": n_wrong,
        "first_error_field": dict(first_field.most_common()),
        "first_error_line": dict(sorted(first_line.items())),
        "first_error_digit": dict(first_digit.most_common()),
        "first_error_in_reasoning": _rate(reasoning, sum(first_line.values())),
        "hazard": {f: {"tokens": reached[f], "first_errors": diverged[f], "rate": _rate(diverged[f], reached[f])}
                   for f in sorted(reached)},
        "result_hazard_by_op": {o: {"tokens": op_reached[o], "first_errors": op_diverged[o],
                                    "rate": _rate(op_diverged[o], op_reached[o])} for o in "+-*/" if op_reached[o]},
        "gapped_commits": _rate(n_gapped, n_commits),
        "clean_commits": {k: {"n": clean_n[k], "error_rate": _rate(commit_stats[(k, False)], clean_n[k])}
                          for k in clean_n},
        "first_wrong_commit_gap": dict(sorted(first_gap.items())),
        "query_by_gap": {str(g): {"n": s[0], "top1_right": s[1] / s[0], "mean_confidence": s[2] / s[0]}
                         for g, s in sorted(query_stats.items())},
    }


def checkpoints(root: Path, run: str, steps: list[int], newest: bool) -> list[tuple[int, Path]]:
    """The run's checkpoints at ``steps`` that exist, and (``newest``) its newest one past them."""
    ck = root / f"ft-{run}" / "checkpoints"
    have = sorted(int(p.name.split("-")[1]) for p in ck.glob("step-*")) if ck.is_dir() else []
    out = [s for s in steps if s in have]
    if newest and have and have[-1] > max(steps):
        out.append(have[-1])
    return [(s, ck / f"step-{s:08d}") for s in out]


def summary(rows: list[dict]) -> str:
    """The markdown tables of ``error_analysis.md``."""
    def pct(v):
        return "—" if v is None else f"{100 * v:.1f}%"

    md = ["| model | step | decode | accuracy | tokens/step | gapped commits | error rate, in-order clean commits "
          "| error rate, gapped clean commits | first error in reasoning lines | first wrong commit gapped |",
          "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        c, g = r["clean_commits"], r["first_wrong_commit_gap"]
        gapped = sum(v for k, v in g.items() if k not in ("0", "none"))
        md.append(f"| {r['run']} | {r['step']} | {r['decode']} | {pct(r['accuracy'])} | {r['tokens_per_step']:.2f} | "
                  f"{pct(r['gapped_commits'])} | {pct(c['in-order']['error_rate'])} (n={c['in-order']['n']}) | "
                  f"{pct(c['gapped']['error_rate'])} (n={c['gapped']['n']}) | {pct(r['first_error_in_reasoning'])} | "
                  f"{gapped} of {sum(g.values())} |")
    fields = ("carry", "op", "operand", "eq", "result", "newline", "marker", "answer", "eos")
    md += ["", "Per-token error rate by field (first divergences / tokens of that field reached with a correct "
               "prefix; the field's share of the wrong answers' first errors in brackets):", "",
           "| model | step | decode | " + " | ".join(fields) + " |", "|---|---:|---|" + "---:|" * len(fields)]
    for r in rows:
        h = r["hazard"]
        cells = [f"{pct(h[f]['rate'])} ({h[f]['first_errors']})" if f in h else "—" for f in fields]
        md.append(f"| {r['run']} | {r['step']} | {r['decode']} | " + " | ".join(cells) + " |")
    md += ["", "The digits wrong answers get wrong first (the four most common, of all first errors):", "",
           "| model | step | decode | first errors by digit |", "|---|---:|---|---|"]
    for r in rows:
        top = list(r["first_error_digit"].items())[:4]
        md.append(f"| {r['run']} | {r['step']} | {r['decode']} | " + "; ".join(f"{k}: {v}" for k, v in top)
                  + f" (of {sum(r['first_error_field'].values())}) |")
    md += ["", "Error rate of the computed result digits by the line's operation:", "",
           "| model | step | decode | + | - | * | / |", "|---|---:|---|---:|---:|---:|---:|"]
    for r in rows:
        h = r["result_hazard_by_op"]
        md.append(f"| {r['run']} | {r['step']} | {r['decode']} | " + " | ".join(
            f"{pct(h[o]['rate'])} ({h[o]['first_errors']}/{h[o]['tokens']})" if o in h else "—" for o in "+-*/") + " |")
    gaps = sorted({int(g) for r in rows for g in r["query_by_gap"]})
    md += ["", "Top-1 accuracy of the query positions at clean forwards, by the number g of masked positions to "
               "their left (g = 0: the full left context, the AR conditional):", "",
           "| model | step | decode | " + " | ".join(f"g={g}" for g in gaps) + " |", "|---|---:|---|" + "---:|" * len(gaps)]
    for r in rows:
        q = r["query_by_gap"]
        md.append(f"| {r['run']} | {r['step']} | {r['decode']} | " + " | ".join(
            f"{pct(q[str(g)]['top1_right'])}" if str(g) in q else "—" for g in gaps) + " |")
    return "\n".join(md) + "\n"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", default="runs/protocol", help="the protocol's run folders")
    ap.add_argument("--n", type=int, default=500, help="validation problems per configuration")
    ap.add_argument("--steps", type=int, nargs="+", default=[1500], help="fine-tuning budgets analysed")
    ap.add_argument("--light", action="store_true", help="only w = 1 and w = D for SetDLM, and only --steps "
                                                         "(a trend over budgets)")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--out", default=str(RESULTS / "error_analysis"), help="writes OUT.json and OUT.md")
    args = ap.parse_args(argv)
    import torch

    import setdlm
    from setdlm.data.tasks import reasoning_split

    torch.set_num_threads(1)
    examples = reasoning_split("validation", args.n, level=LEVEL, seed=0)
    rows = []
    setdlm_decodes = SETDLM_DECODES[:2] if args.light else SETDLM_DECODES
    for run, decodes in (("ar", (("left to right", {}),)), ("setdlm-smax8", setdlm_decodes)):
        for step, path in checkpoints(Path(args.root), run, args.steps, newest=not args.light):
            model = setdlm.load(str(path))
            for label, settings in decodes:
                r = {"run": run, "step": step, "decode": label,
                     **analyse(model, examples, settings, batch_size=args.batch_size, seed=0)}
                rows.append(r)
                print(f"[errors] {run} step {step} {label:18s} acc={r['accuracy']:.3f} "
                      f"tok/step={r['tokens_per_step']:.2f} ({r['cpu_seconds']} s)", flush=True)
    if not rows:
        raise SystemExit(f"no checkpoint of ft-ar or ft-setdlm-smax8 at steps {args.steps} under {args.root}")
    out = Path(args.out)
    meta = {"split": "validation", "level": LEVEL, "n": args.n, "greedy": True, "seed": 0,
            "command": "python benchmarks/study/error_analysis.py " + " ".join(argv if argv is not None else sys.argv[1:])}
    out.with_suffix(".json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")
    md = summary(rows)
    out.with_suffix(".md").write_text(f"# Where the answers go wrong (validation split, {args.n} medium problems)\n\n"
                                      f"`{meta['command']}`\n\n" + md)
    print(md)


if __name__ == "__main__":
    main()
