"""Turn ``benchmarks/study/results/raw.jsonl`` into tables in the paper's layout, the Pareto plot and a
check of the paper's claims: ``python benchmarks/study/report.py`` writes ``results/report.md`` and
``results/pareto_reasoning.png`` (copied into ``benchmarks/RESULTS.md`` by hand, with the discussion)."""

from __future__ import annotations

import json
import math
from pathlib import Path

HERE = Path(__file__).parent
RAW = HERE / "results" / "raw.jsonl"
LABEL = {"ar": "AR", "mdlm": "MDLM", "bd3lm-s4": "BD3LM S=4", "bd3lm-s8": "BD3LM S=8",
         "setdlm-smax8": "SetDLM S≤8 (D=4, M=8)", "setdlm-smax16": "SetDLM S≤16 (D=8, M=16)",
         "setdlm-smax8-from-ar": "SetDLM S≤8 adapted from AR (+300 steps)"}
ORDER = list(LABEL)
SWEEP = ["off"] + [f"tau={t}" for t in (0.99, 0.95, 0.9, 0.85, 0.8, 0.75, 0.7, 0.65, 0.6)]  # evaluate_study.TAUS
# the paper's numbers (RESULTS.md): LM1B Table 9 (PPL, tok/s), GSM8K Table 1 (PPL, pass@1, tok/s),
# ROCStories Table 2 infill 1/5 (R-1/R-2/R-L, tok/s); "—" where the paper has no such model
PAPER_LM1B = {"ar": ("22.83", "120.1"), "mdlm": ("≤ 31.78", "≥ 37.7"), "bd3lm-s4": ("≤ 28.23", "≥ 76.9"),
              "bd3lm-s8": ("≤ 28.95", "≥ 75.0"), "setdlm-smax8": ("≤ 27.83", "≥ 98.5"),
              "setdlm-smax16": ("≤ 29.90", "≥ 96.7")}
PAPER_GSM8K = {"ar": ("1.25", "75.74", "67.16"), "mdlm": ("≤ 2.10", "6.37", "≥ 24.48"),
               "bd3lm-s4": ("≤ 1.41", "63.53", "≥ 55.39"), "bd3lm-s8": ("≤ 1.53", "56.94", "≥ 54.67"),
               "setdlm-smax8": ("≤ 1.42", "66.41", "≥ 60.42"), "setdlm-smax16": ("≤ 1.50", "63.91", "≥ 56.50"),
               "setdlm-smax8-from-ar": ("—", "—", "—")}
PAPER_INFILL = {"ar": ("8.2 / 0.5 / 7.6", "159.7"), "mdlm": ("14.5 / 1.6 / 13.3", "≥ 71.9"),
                "bd3lm-s4": ("9.2 / 0.6 / 8.6 (S=16)", "≥ 105.8 (S=16)"), "bd3lm-s8": ("", ""),
                "setdlm-smax8": ("11.6 / 1.0 / 10.9 (S≤32)", "≥ 132.0 (S≤32)"), "setdlm-smax16": ("", "")}


def load() -> dict:
    rows = {}
    for r in map(json.loads, RAW.read_text().splitlines()):
        rows[(r["task"], r["run"].split("-", 1)[1], r["setting"])] = r
    return rows


def fam_of(run: str) -> str:
    return run


def speed(r: dict) -> str:
    return f"{r['tok_s']:.0f} ± {r['tok_s_std']:.0f}"


def lm_table(rows) -> str:
    out = ["| model | bound (nats/token) | PPL | tok/s (batch 1) | NFE / 64 tokens | paper LM1B PPL | paper tok/s |",
           "|---|---|---|---|---|---|---|"]
    for f in ORDER:
        b, s = rows.get(("lm", f, "bound")), rows.get(("lm", f, "speed"))
        if not b or not s:
            continue
        le = "" if f == "ar" else "≤ "
        out.append(f"| {LABEL[f]} | {le}{b['nelbo']:.3f} | {le}{b['ppl']:.2f} | {speed(s)} | "
                   f"{s['nfe_per_example']:.0f} | {PAPER_LM1B[f][0]} | {PAPER_LM1B[f][1]} |")
    return "\n".join(out)


def reason_table(rows) -> str:
    out = ["| model | PPL (completions) | accuracy, τ off | tok/s (batch 1) | tokens/step | paper GSM8K PPL | "
           "paper pass@1 | paper tok/s |", "|---|---|---|---|---|---|---|---|"]
    for f in ORDER:
        b, a = rows.get(("reason", f, "bound")), rows.get(("reason", f, "off"))
        if not b or not a:
            continue
        le = "" if f == "ar" else "≤ "
        p = PAPER_GSM8K[f]
        out.append(f"| {LABEL[f]} | {le}{b['ppl']:.3f} | {100 * a['accuracy']:.1f} | {speed(a)} | "
                   f"{a['tokens_per_step']:.2f} | {p[0]} | {p[1]} | {p[2]} |")
    return "\n".join(out)


def pareto_table(rows) -> str:
    taus = SWEEP
    head = "| model | | " + " | ".join(t.replace("tau=", ".").replace("0.", "") if t != "off" else "off" for t in taus)
    out = [head + " |", "|---|---|" + "---|" * len(taus)]
    for f in ORDER:
        pts = [rows.get(("reason", f, t)) for t in taus]
        if not pts[0]:
            continue
        for name, key, fmt in (("acc %", "accuracy", lambda v: f"{100 * v:.1f}"), ("tok/s", "tok_s", lambda v: f"{v:.0f}"),
                               ("tok/step", "tokens_per_step", lambda v: f"{v:.2f}")):
            cells = [fmt(p[key]) if p else "" for p in pts]
            out.append(f"| {LABEL[f] if name == 'acc %' else ''} | {name} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def infill_table(rows) -> str:
    out = ["| model | ROUGE-1 / 2 / L | tok/s (batch 1) | NFE / example | paper infill 1/5 R-1/2/L | paper tok/s |",
           "|---|---|---|---|---|---|"]
    for f in ORDER:
        r = rows.get(("infill", f, "off"))
        if not r:
            continue
        p = PAPER_INFILL[f]
        out.append(f"| {LABEL[f]} | {100 * r['rouge1']:.1f} / {100 * r['rouge2']:.1f} / {100 * r['rougeL']:.1f} | "
                   f"{speed(r)} | {r['nfe_per_example']:.1f} | {p[0]} | {p[1]} |")
    return "\n".join(out)


def plot(rows, path: Path) -> None:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7.5, 4.8), dpi=110, layout="constrained")
    ax = fig.subplots()
    for f in ORDER:
        pts = sorted((r for (t, ff, s), r in rows.items() if t == "reason" and ff == f and s in SWEEP),
                     key=lambda r: r["tok_s"])
        if not pts:
            continue
        style = "-o" if f.startswith("setdlm") else ("--s" if f.startswith("bd3lm") else "*")
        ax.plot([r["tok_s"] for r in pts], [100 * r["accuracy"] for r in pts], style, label=LABEL[f],
                markersize=9 if f == "ar" else 4)
    ax.set_xlabel("tokens per CPU-second (batch 1, one thread, mean per problem)")
    ax.set_ylabel("exact-match accuracy (%)")
    ax.set_title("Arithmetic word problems (medium): accuracy vs speed over the threshold sweep")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.savefig(path)


def budget_table(runs: Path = Path("runs/study")) -> str:
    """Parameters, training tokens and wall minutes of each trained run (from its folder and times.jsonl;
    a run whose driver was not timing it is timed by the span between its first and last checkpoints)."""
    from safetensors import safe_open

    times = {}
    if (runs / "times.jsonl").exists():
        for r in map(json.loads, (runs / "times.jsonl").read_text().splitlines()):
            times[r["run"]] = r["seconds"]
    out = ["| run | parameters | steps × batch × L | training tokens | wall minutes | median tokens/s |",
           "|---|---:|---:|---:|---:|---:|"]
    for d in sorted(p for p in runs.iterdir() if (p / "latest").exists()):
        ck = sorted((d / "checkpoints").glob("step-*"))[-1]
        cfg = json.loads((ck / "config.json").read_text())
        tr = cfg["training"]
        with safe_open(ck / "model.safetensors", "pt") as f:
            n = sum(math.prod(f.get_slice(k).get_shape()) for k in f.keys())
        steps = int(ck.name.split("-")[1])
        tokens = steps * tr["batch_size"] * cfg["family"]["length"]
        first = sorted((d / "checkpoints").glob("step-*"))[0]
        s0 = int(first.name.split("-")[1])  # untimed runs: the checkpoints' spacing, scaled to all steps
        secs = times.get(d.name, (ck.stat().st_mtime - first.stat().st_mtime) * steps / max(1, steps - s0))
        rates = sorted(r["tokens_per_s"] for r in map(json.loads, (d / "metrics.jsonl").read_text().splitlines())
                       if "tokens_per_s" in r)
        out.append(f"| {d.name} | {n / 1e6:.2f}M | {steps} × {tr['batch_size']} × {cfg['family']['length']} | "
                   f"{tokens / 1e6:.2f}M | {secs / 60:.1f} | {rates[len(rates) // 2]:,.0f} |")
    return "\n".join(out)


def claims(rows) -> list[str]:
    """The issue's targets (the paper's claims), each checked on the numbers."""
    out = []

    def g(*k):
        return rows.get(k)

    for task, name in (("lm", "Shakespeare"), ("reason", "reasoning")):
        s8, b4, md = (g(task, f, "bound") for f in ("setdlm-smax8", "bd3lm-s4", "mdlm"))
        if s8 and b4 and md:
            ok = s8["nelbo"] <= b4["nelbo"] < md["nelbo"]
            out.append(f"- Bound, {name}: SetDLM S≤8 {s8['nelbo']:.4f} ≤ BD3LM S=4 {b4['nelbo']:.4f} < MDLM "
                       f"{md['nelbo']:.4f} nats/token: **{'holds' if ok else 'does not hold'}**.")
    s8, b4 = g("reason", "setdlm-smax8", "off"), g("reason", "bd3lm-s4", "off")
    if s8 and b4:
        ratio = s8["tok_s"] / b4["tok_s"]
        ok = ratio >= 1.15 and s8["accuracy"] >= b4["accuracy"]
        out.append(f"- Reasoning, τ off: SetDLM S≤8 decodes {ratio:.3f}× the tokens/s of BD3LM S=4 "
                   f"({s8['tok_s']:.0f} vs {b4['tok_s']:.0f}) at {100 * s8['accuracy']:.1f}% vs "
                   f"{100 * b4['accuracy']:.1f}% accuracy (target ≥ 1.15× at equal or better accuracy): "
                   f"**{'holds' if ok else 'does not hold'}**.")
    s8, b4 = g("infill", "setdlm-smax8", "off"), g("infill", "bd3lm-s4", "off")
    if s8 and b4:
        ok = s8["rougeL"] > b4["rougeL"] and s8["tok_s"] > b4["tok_s"]
        out.append(f"- Infilling: SetDLM S≤8 ROUGE-L {100 * s8['rougeL']:.1f} at {s8['tok_s']:.0f} tok/s vs BD3LM S=4 "
                   f"{100 * b4['rougeL']:.1f} at {b4['tok_s']:.0f} tok/s (target: higher ROUGE-L at higher "
                   f"tokens/s): **{'holds' if ok else 'does not hold'}**.")
    s8, ar = g("reason", "setdlm-smax8", "tau=0.9"), g("reason", "ar", "off")
    if s8 and ar:
        ok = s8["tok_s"] > ar["tok_s"]
        out.append(f"- Reasoning, batch 1: SetDLM S≤8 at τ = 0.9 {s8['tok_s']:.0f} tok/s "
                   f"({s8['tokens_per_step']:.2f} tokens/step, {100 * s8['accuracy']:.1f}%) vs AR {ar['tok_s']:.0f} "
                   f"tok/s ({100 * ar['accuracy']:.1f}%) (target: faster than AR): **{'holds' if ok else 'does not hold'}**.")
    # matched-speed reading of the Pareto curves, as the paper's Figure 4 discussion
    for a, b in (("setdlm-smax8", "bd3lm-s4"), ("setdlm-smax16", "bd3lm-s8")):
        pa = [r for (t, f, s), r in rows.items() if t == "reason" and f == a and s in SWEEP]
        pb = [r for (t, f, s), r in rows.items() if t == "reason" and f == b and s in SWEEP]
        if pa and pb:
            wins = sum(any(x["tok_s"] >= y["tok_s"] and x["accuracy"] >= y["accuracy"] for x in pa) for y in pb)
            out.append(f"- Pareto: {wins} of {len(pb)} {LABEL[b]} points are matched or beaten on both accuracy "
                       f"and tokens/s by some {LABEL[a]} point.")
    return out


def headline(rows) -> str:
    """The README's table: one row per family, the three tasks side by side (τ off)."""
    out = ["| model | Shakespeare bound (nats/token) | word problems: accuracy | tok/s | infill ROUGE-L | tok/s |",
           "|---|---:|---:|---:|---:|---:|"]
    for f in ORDER:
        b, a, i = rows.get(("lm", f, "bound")), rows.get(("reason", f, "off")), rows.get(("infill", f, "off"))
        if not (b or a):
            continue
        le = "" if f == "ar" else "≤ "
        out.append(f"| {LABEL[f]} | {le + format(b['nelbo'], '.2f') if b else '—'} | "
                   f"{format(100 * a['accuracy'], '.1f') + '%' if a else '—'} | {format(a['tok_s'], '.0f') if a else '—'} | "
                   f"{format(100 * i['rougeL'], '.1f') if i else '—'} | {format(i['tok_s'], '.0f') if i else '—'} |")
    return "\n".join(out)


def main() -> None:
    rows = load()
    png = HERE / "results" / "pareto_reasoning.png"
    plot(rows, png)
    md = ["## (a) Language modelling: Shakespeare (≈ paper Table 9, LM1B)", "", lm_table(rows), "",
          "## (b) Reasoning: arithmetic word problems (≈ paper Table 1, GSM8K)", "", reason_table(rows), "",
          "### Threshold sweep (≈ paper Figure 4 / §3.2 table)", "", pareto_table(rows), "",
          f"![pareto]({png.name})", "",
          "## (c) Infilling: middle sentence of 5 (≈ paper Table 2, ROCStories infill 1/5)", "", infill_table(rows),
          "", "## The paper's claims at this scale", "", *claims(rows), "",
          "## Training budgets", "", budget_table() if Path("runs/study").is_dir() else "(runs/study not present)", ""]
    (HERE / "results" / "report.md").write_text("\n".join(md))
    (HERE / "results" / "headline.md").write_text(headline(rows) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()
