"""The learning curves of the paper's protocol (issue 22, item 2): plot, table, and where SetDLM reaches AR.

``python benchmarks/study/learning_curves.py [CURVES.jsonl] [--out-dir DIR]``

Reads the points that ``benchmarks/study/protocol.py curves`` appends to ``results/curves.jsonl`` (one JSON line
per run, fine-tuning step and decode setting: ``accuracy``, ``tokens_per_step``, and with the threshold off the
held-out ``bound_ppl``) and writes, next to it (or in ``--out-dir``):

* ``learning_curves.png``: accuracy against fine-tuning steps for every family (threshold off solid, τ = 0.9
  dashed), the AR base as a point at step 0, a horizontal line at 0.85x the AR fine-tune's best accuracy and the
  extrapolation of SetDLM S<=8 dotted; a second panel with the held-out bound PPL (an upper bound for every
  family but AR, docs/method.md §3).
* ``learning_curves.md``: a table family x budget (accuracy τ off / τ 0.9, tokens per step at τ 0.9, bound PPL),
  the SetDLM S<=8 / AR accuracy ratio at every budget, the first budget at which it reaches 0.85x AR (or the best
  ratio it reaches) with BD3LM S=4 at that budget, and the extrapolation, labelled as such.

The paper's comparison is at equal budgets (every family fine-tuned for the same steps, paper §5.2), so the
ratio at a budget divides by the AR fine-tune *at that budget*.
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import dataclass
from pathlib import Path

RESULTS = Path(__file__).parent / "results"
LABEL = {"ar": "AR", "setdlm-smax8": "SetDLM S≤8 (D=4, M=8)", "bd3lm-s4": "BD3LM S=4",
         "setdlm-smax16": "SetDLM S≤16 (D=8, M=16)", "mdlm": "MDLM"}
BASE = "base-ar"  # the pretrained AR every family starts from: drawn at step 0
TARGET = 0.85  # the paper's claim: SetDLM keeps >= 0.85x AR's accuracy (GSM8K 66.41 / 75.74 = 0.88x)
HEAD, REF, FLOOR = "setdlm-smax8", "ar", "bd3lm-s4"


def load(path: Path) -> dict[tuple[str, int, str], dict]:
    """``(run, step, setting) -> row`` of a curves.jsonl; a later line for the same point replaces an earlier."""
    rows = {}
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        r = json.loads(line)
        for k in ("run", "step", "setting", "accuracy"):
            if k not in r:
                raise ValueError(f"{path}:{n}: a curves row needs {k!r}")
        rows[(r["run"], int(r["step"]), r["setting"])] = r
    return rows


def budgets(rows) -> list[int]:
    """The fine-tuning steps measured for any family (the base's pretraining steps are not a budget)."""
    return sorted({s for (run, s, _) in rows if run != BASE})


def families(rows) -> list[str]:
    """The fine-tuned runs present, the table's order first."""
    present = {run for (run, _, _) in rows if run != BASE}
    return [f for f in LABEL if f in present] + sorted(present - set(LABEL))


def acc(rows, run: str, step: int, setting: str = "tau-off") -> float | None:
    r = rows.get((run, step, setting))
    return None if r is None else r["accuracy"]


def ratios(rows) -> dict[int, float]:
    """SetDLM S<=8 accuracy / AR accuracy (threshold off) at every budget where both were measured."""
    out = {}
    for s in budgets(rows):
        a, b = acc(rows, HEAD, s), acc(rows, REF, s)
        if a is not None and b:
            out[s] = a / b
    return out


def reached(rows, target: float = TARGET) -> tuple[int | None, float | None, int | None]:
    """``(first budget with ratio >= target or None, the best ratio, the budget of the best ratio)``."""
    r = ratios(rows)
    first = next((s for s in sorted(r) if r[s] >= target), None)
    best = max(r, key=r.get) if r else None
    return first, (r[best] if r else None), best


@dataclass(frozen=True)
class LogitFit:
    """An extrapolation, not a measurement: ``logit(accuracy) = a + b ln(steps)`` fitted by least squares to a
    family's threshold-off points (a straight line in log steps that stays inside (0, 1))."""

    a: float
    b: float
    points: int

    def accuracy(self, steps: float) -> float:
        return 1.0 / (1.0 + math.exp(-(self.a + self.b * math.log(steps))))

    def steps_to(self, accuracy: float) -> float | None:
        """Steps at which the fitted line reaches ``accuracy`` (None when it never rises)."""
        if self.b <= 0:
            return None
        return math.exp((math.log(accuracy / (1 - accuracy)) - self.a) / self.b)


def fit(rows, run: str) -> LogitFit | None:
    """The :class:`LogitFit` of ``run`` (None with fewer than two points strictly inside (0, 1))."""
    pts = [(math.log(s), math.log(a / (1 - a))) for s in budgets(rows)
           if (a := acc(rows, run, s)) is not None and 0 < a < 1]
    if len(pts) < 2:
        return None
    mx, my = sum(x for x, _ in pts) / len(pts), sum(y for _, y in pts) / len(pts)
    sxx = sum((x - mx) ** 2 for x, _ in pts)
    if sxx == 0:
        return None
    b = sum((x - mx) * (y - my) for x, y in pts) / sxx
    return LogitFit(a=my - b * mx, b=b, points=len(pts))


def _last(rows, run: str) -> int:
    """The largest budget at which ``run`` was measured with the threshold off."""
    return max(s for s in budgets(rows) if acc(rows, run, s) is not None)


def _pct(v: float | None) -> str:
    return "—" if v is None else f"{100 * v:.1f}%"


def table(rows) -> str:
    """The markdown table: one row per family and budget, the base first."""
    out = ["| model | fine-tuning steps | accuracy, τ off | accuracy, τ 0.9 | tokens/step, τ 0.9 | held-out PPL (bound) |",
           "|---|---:|---:|---:|---:|---:|"]
    for (run, s, setting), r in sorted(rows.items()):
        if run == BASE and setting == "tau-off":
            out.append(f"| base AR (pretrained {s:,} steps) | 0 | {_pct(r['accuracy'])} | — | — | "
                       f"{r.get('bound_ppl', float('nan')):.3f} |")
    for f in families(rows):
        for s in budgets(rows):
            off, t9 = rows.get((f, s, "tau-off")), rows.get((f, s, "tau-0.9"))
            if not off and not t9:
                continue
            le = "" if f == REF else "≤ "
            ppl = f"{le}{off['bound_ppl']:.3f}" if off and off.get("bound_ppl") is not None else "—"
            out.append(f"| {LABEL.get(f, f)} | {s:,} | {_pct(off and off['accuracy'])} | "
                       f"{'— (one token a step)' if f == REF else _pct(t9 and t9['accuracy'])} | "
                       f"{format(t9['tokens_per_step'], '.2f') if t9 else '—'} | {ppl} |")
    return "\n".join(out)


def verdict(rows) -> list[str]:
    """The ratio per budget, the budget at which SetDLM S<=8 reaches 0.85x AR, and the extrapolation."""
    r = ratios(rows)
    out = ["| fine-tuning steps | " + " | ".join(f"{s:,}" for s in sorted(r)) + " |",
           "|---|" + "---:|" * len(r),
           f"| {LABEL[HEAD]} / AR accuracy (τ off, same budget) | " + " | ".join(f"{r[s]:.2f}x" for s in sorted(r)) + " |",
           ""]
    first, best, at = reached(rows)
    if first is not None:
        b4 = acc(rows, FLOOR, first)
        vs = ("BD3LM S=4 not measured at that budget" if b4 is None else
              f"BD3LM S=4 there: {_pct(b4)}, so SetDLM S≤8 is {'above' if acc(rows, HEAD, first) > b4 else 'not above'} it")
        out.append(f"- SetDLM S≤8 first reaches {TARGET}x the AR fine-tune's accuracy at **{first:,} steps** "
                   f"({_pct(acc(rows, HEAD, first))} vs {_pct(acc(rows, REF, first))}, {r[first]:.2f}x); {vs}.")
    elif best is not None:
        out.append(f"- SetDLM S≤8 does not reach {TARGET}x the AR fine-tune's accuracy at any measured budget; the best "
                   f"ratio is **{best:.2f}x** at {at:,} steps ({_pct(acc(rows, HEAD, at))} vs {_pct(acc(rows, REF, at))}).")
    best_ar = max((v for s in budgets(rows) if (v := acc(rows, REF, s)) is not None), default=None)
    fh = fit(rows, HEAD)
    if best_ar is not None and fh is not None:
        goal = TARGET * best_ar
        steps = fh.steps_to(goal)
        last = _last(rows, HEAD)
        when = "never (the fitted line does not rise)" if steps is None else f"about {steps:,.0f} steps"
        out.append(f"- *Extrapolation, not a measurement*: a line in log steps through the logit of SetDLM S≤8's "
                   f"{fh.points} threshold-off points (logit(acc) = {fh.a:.2f} + {fh.b:.2f} ln steps) reaches "
                   f"{TARGET}x the AR fine-tune's best accuracy ({_pct(goal)}) at {when}; at 2x the last budget "
                   f"({2 * last:,} steps) it predicts {_pct(fh.accuracy(2 * last))}. Accuracy saturates, so read "
                   f"this as a rough guide to the trend only.")
    return out


def _color(run: str) -> str:
    names = list(LABEL)
    return f"C{names.index(run) if run in names else len(names) + sum(map(ord, run)) % 5}"


def plot(rows, path: Path) -> None:
    """Accuracy and bound against fine-tuning steps (matplotlib, imported here: the ``plot`` extra)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(11, 4.6), dpi=110, layout="constrained")
    ax, bx = fig.subplots(1, 2)
    base = next((r for (run, _, st), r in rows.items() if run == BASE and st == "tau-off"), None)
    for f in families(rows):
        color = _color(f)
        for setting, style in (("tau-off", "-o"), ("tau-0.9", "--s")):
            pts = [(s, rows[(f, s, setting)]) for s in budgets(rows) if (f, s, setting) in rows]
            if pts:
                label = LABEL.get(f, f) + ("" if setting == "tau-off" else ", τ 0.9")
                ax.plot([s for s, _ in pts], [100 * r["accuracy"] for s, r in pts], style, color=color,
                        label=label, markersize=4)
        ppl = [(s, rows[(f, s, "tau-off")]["bound_ppl"]) for s in budgets(rows)
               if rows.get((f, s, "tau-off"), {}).get("bound_ppl") is not None]
        if ppl:
            bx.plot([s for s, _ in ppl], [p for _, p in ppl], "-o", color=color, label=LABEL.get(f, f), markersize=4)
    if base is not None:
        ax.plot([0], [100 * base["accuracy"]], "k*", markersize=12, label="AR base (step 0)")
    best_ar = max((v for s in budgets(rows) if (v := acc(rows, REF, s)) is not None), default=None)
    if best_ar is not None:
        ax.axhline(100 * TARGET * best_ar, color="grey", lw=1, ls=":", label=f"{TARGET}x AR fine-tune's best")
    fh = fit(rows, HEAD)
    if fh is not None:
        last = _last(rows, HEAD)
        xs = [last * (1 + k / 20) for k in range(21)]
        ax.plot(xs, [100 * fh.accuracy(x) for x in xs], ":", color=_color(HEAD), lw=1.5,
                label="SetDLM S≤8 extrapolated (logit-log fit)")
    ax.set_xlabel("fine-tuning steps (batch 32)")
    split = next(iter(rows.values())).get("split", "test")
    ax.set_ylabel(f"exact-match accuracy (%), {split} problems")
    ax.set_title("Word problems (medium): accuracy vs fine-tuning budget")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    bx.set_xlabel("fine-tuning steps (batch 32)")
    bx.set_ylabel("held-out PPL (upper bound except AR)")
    bx.set_title("Held-out bound")
    bx.grid(alpha=0.3)
    bx.legend(fontsize=7)
    fig.savefig(path)


def write(curves: Path, out_dir: Path) -> str:
    """Write ``learning_curves.png`` and ``learning_curves.md`` into ``out_dir``; returns the markdown."""
    rows = load(curves)
    if not rows:
        raise ValueError(f"{curves} holds no learning-curve points")
    out_dir.mkdir(parents=True, exist_ok=True)
    plot(rows, out_dir / "learning_curves.png")
    md = "\n".join(["# Learning curves of the paper's protocol", "",
                    f"From `{curves.name}` by `python benchmarks/study/learning_curves.py`.", "", table(rows), "",
                    *verdict(rows), "", "![learning curves](learning_curves.png)", ""])
    (out_dir / "learning_curves.md").write_text(md)
    return md


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("curves", nargs="?", default=str(RESULTS / "curves.jsonl"))
    ap.add_argument("--out-dir", help="where to write (default: next to the curves file)")
    args = ap.parse_args(argv)
    curves = Path(args.curves)
    print(write(curves, Path(args.out_dir) if args.out_dir else curves.parent))


if __name__ == "__main__":
    main()
