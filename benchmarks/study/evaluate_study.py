"""Evaluate the study's trained models: ``python benchmarks/study/evaluate_study.py [--quick]``.

Every measurement is one JSON line in ``benchmarks/study/results/raw.jsonl`` keyed by (task, run,
setting); a measurement already there is skipped, so the script resumes where it stopped.

* (a) ``lm``: held-out likelihood bound (``setdlm eval RUN``: the trainer's fixed held-out rows, one order
  or mask sample per row, docs/method.md §5.1) and decoding speed: 64 new tokens after 16-token held-out prompts,
  batch 1, greedy, threshold off, the first ``WARMUP`` prompts excluded (docs/method.md §4.10).
* (b) ``reason``: held-out bound of the completions; exact-match accuracy on ``N_REASON`` test problems
  (decoded in batches) and batch-1 speed on the first ``N_SPEED`` of them, for the confidence thresholds
  ``TAUS`` (off, .99, .95, ..., .6: docs/method.md §5.2's ten); SetDLM decodes with w = D and
  reveal-time cache order, BD3LM with its S,
  MDLM with sub-blocks of 32; AR once.
* (c) ``infill``: the LM models fill the middle sentence of 5-sentence held-out Shakespeare windows with
  the oracle length (greedy, threshold off, repetition penalty 1.2, docs/method.md §5.4); SetDLM with w = M;
  AR sees only the prefix. ROUGE-1/2/L over all windows; batch-1 speed on the first ``N_INFILL_SPEED``.

Speed is the CPU time of this process with one torch thread (``clock="cpu"``), so that the evaluation can
run beside the study's training; ``--respeed`` then measures every recorded speed again once nothing
else runs, all configurations of a task interleaved example by example so that they are compared side by
side (the numbers in benchmarks/RESULTS.md are those).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from runs import ADAPT, FAMILIES, steps_of  # noqa: E402

import setdlm  # noqa: E402
from setdlm.evaluation.infill import infill  # noqa: E402
from setdlm.evaluation.passes import EvalRun, fits, interleave  # noqa: E402
from setdlm.evaluation.reasoning import reasoning  # noqa: E402
from setdlm.evaluation.throughput import throughput_steps  # noqa: E402
from setdlm.data.sources import infill_from_source  # noqa: E402
from setdlm.data.tasks import reasoning_split  # noqa: E402
from setdlm.decoding import DecodeSettings  # noqa: E402

RUNS = Path("runs/study")
OUT = Path(__file__).parent / "results"
N_REASON, N_SPEED, WARMUP = 300, 40, 5
N_INFILL_SPEED = 50  # the first examples, timed one at a time after the warm-up
# the threshold sweep: docs/method.md §5.2's (off, .99, .95, ..., .6)
TAUS = (None, 0.99, 0.95, 0.9, 0.85, 0.8, 0.75, 0.7, 0.65, 0.6)
CLOCK = "cpu"
LM_PROMPT, LM_NEW, LM_PROMPTS = 16, 64, 50


def load_done() -> set:
    raw = OUT / "raw.jsonl"
    if not raw.exists():
        return set()
    return {(r["task"], r["run"], r["setting"]) for r in map(json.loads, raw.read_text().splitlines())}


def record(row: dict) -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    with open(OUT / "raw.jsonl", "a") as f:
        f.write(json.dumps(row) + "\n")
    print(f"[eval] {row['task']:6s} {row['run']:22s} {row['setting']:12s} "
          + " ".join(f"{k}={v:.4g}" for k, v in row.items() if isinstance(v, float)), flush=True)


def bound(run: str) -> dict:
    """The held-out bound through the CLI (the same rows and seed as the trainer's evaluation)."""
    out = subprocess.run(["setdlm", "eval", str(RUNS / run)], check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def decode_settings(model, task: str, tau, **more) -> DecodeSettings:
    """The study's decoding settings of ``model`` on ``task`` at threshold ``tau``, plus ``more``."""
    fam = model.family
    kw = {} if tau is None else {"threshold": tau}
    if fam.family == "mdlm":
        kw["block_size"] = 32
    if fam.family == "setdlm":
        kw["window"] = fam.M if task == "infill" else fam.D
        if task == "reason":
            kw["cache_order"] = "reveal"
    return DecodeSettings(**kw, **more)


def speed_row(stats) -> dict:
    return {"tok_s": stats.mean, "tok_s_std": stats.std, "tok_s_aggregate": stats.aggregate,
            "nfe_per_example": stats.nfe / stats.calls if stats.nfe is not None else None,
            "tokens_per_example": stats.tokens / stats.calls,
            "tokens_per_step": stats.tokens_per_step}


def eval_lm(run: str, done: set, quick: bool) -> None:
    model = setdlm.load(RUNS / run)
    if ("lm", run, "bound") not in done:
        b = bound(run)
        record({"task": "lm", "run": run, "setting": "bound", "family": model.family.family, "nelbo": b["nelbo"],
                "ppl": b["ppl"], "tokens": b["tokens"]})
    if ("lm", run, "speed") not in done:
        record({"task": "lm", "run": run, "setting": "speed", "family": model.family.family,
                **speed(speed_pass("lm", run, model, None, quick))})


def speed_pass(task: str, run: str, model, tau, quick: bool, infill_pool=None):
    """The batch-1 timing of one configuration as an :func:`setdlm.evaluation.throughput.throughput_steps` pass (run it
    with :func:`speed`, or several side by side with ``interleave``): (a) 64 tokens after each of
    the first ``LM_PROMPTS`` held-out prompts, (b) the first ``N_SPEED`` test problems, (c) the first
    ``WARMUP + N_INFILL_SPEED`` examples of ``infill_pool``; the first ``WARMUP`` calls untimed."""
    more = {}
    if task == "lm":
        from setdlm.formats.checkpoint import read_config
        from setdlm.training import heldout_of

        rows = heldout_of(read_config(RUNS / run)["training"], model.tokenizer)
        items = [ids[:LM_PROMPT] for ids in rows.input_ids[: 12 if quick else LM_PROMPTS].tolist()]
        more = {"max_new_tokens": LM_NEW, "ignore_eos": True}
    elif task == "reason":
        items = reasoning_split("test", 14 if quick else N_SPEED, level="medium", seed=0)
    else:
        items = infill_pool[: (12 if quick else WARMUP + N_INFILL_SPEED)]
        more = {"repetition_penalty": 1.2}
    return throughput_steps(model, items, decode_settings(model, task, tau, **more),
                            EvalRun(warmup=2 if quick else WARMUP, progress=False, clock=CLOCK))


def speed(steps) -> dict:
    """Run one :func:`speed_pass` alone; its speed fields for raw.jsonl."""
    return speed_row(interleave([steps])[0])


def eval_reason(run: str, done: set, quick: bool) -> None:
    model = setdlm.load(RUNS / run)
    if ("reason", run, "bound") not in done:
        b = bound(run)
        record({"task": "reason", "run": run, "setting": "bound", "family": model.family.family,
                "nelbo": b["nelbo"], "ppl": b["ppl"], "tokens": b["tokens"]})
    problems = reasoning_split("test", 40 if quick else N_REASON, level="medium", seed=0)
    taus = [None] if model.family.family == "ar" else (TAUS[:2] if quick else TAUS)
    for tau in taus:
        setting = "off" if tau is None else f"tau={tau}"
        if ("reason", run, setting) in done:
            continue
        acc = reasoning(model, problems, decode_settings(model, "reason", tau), EvalRun(batch_size=50, progress=False))
        record({"task": "reason", "run": run, "setting": setting, "family": model.family.family,
                "threshold": tau, "accuracy": acc.accuracy, "n": len(problems),
                "tokens_per_step_acc": acc.run.tokens_per_step,
                **speed(speed_pass("reason", run, model, tau, quick))})


def infill_examples(models, quick: bool):
    """Held-out 5-sentence windows (validation and test splits) that fit every LM model."""
    ex = []
    for split in ("validation", "test"):
        ex += infill_from_source("shakespeare", split, sentences=5, hidden=1, seed=0)
    ok = [e for e in ex if all(fits(m, e) for m in models)]
    return ok[:12] if quick else ok


def eval_infill(runs: list[str], done: set, quick: bool) -> None:
    models = {r: setdlm.load(RUNS / r) for r in runs}
    examples = infill_examples(list(models.values()), quick)
    for run, model in models.items():
        if ("infill", run, "off") in done:
            continue
        res = infill(model, examples, decode_settings(model, "infill", None, repetition_penalty=1.2),
                     EvalRun(batch_size=16, progress=False))
        record({"task": "infill", "run": run, "setting": "off", "family": model.family.family,
                "rouge1": res.rouge1, "rouge2": res.rouge2, "rougeL": res.rougeL, "n": len(examples),
                **speed(speed_pass("infill", run, model, None, quick, examples))})


def respeed(quick: bool) -> None:
    """Measure every speed in raw.jsonl again, side by side, and rewrite the file atomically: qualities stay,
    the speed fields are replaced and the row is marked ``"speed": "interleaved"``.

    Within a task every configuration (run, threshold) times the same examples *interleaved*
    (``interleave``): example i is decoded by every configuration in turn (the order rotated by i)
    before example i + 1, so a drift of the machine's speed over minutes (a shared host's CPU) hits all of
    them alike and the ratios between rows stay fair."""
    from tqdm import tqdm

    raw = OUT / "raw.jsonl"
    rows = [json.loads(line) for line in raw.read_text().splitlines()]
    todo = [r for r in rows if "tok_s" in r and (r["task"] != "reason" or r.get("threshold") in TAUS)]
    models = {run: setdlm.load(RUNS / run) for run in dict.fromkeys(r["run"] for r in todo)}
    for task in ("lm", "reason", "infill"):
        group = [r for r in todo if r["task"] == task]
        if not group:
            continue
        pool = infill_examples([models[r["run"]] for r in group], quick) if task == "infill" else None
        passes = [speed_pass(task, r["run"], models[r["run"]], r.get("threshold"), quick, pool) for r in group]
        with tqdm(desc=f"respeed {task} ({len(group)} configurations side by side)", unit="call") as bar:
            stats = interleave(passes, progress=lambda: bar.update(1))
        for r, st in zip(group, stats):
            r.update(speed_row(st), speed="interleaved")
    tmp = raw.with_suffix(".tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in rows))
    tmp.replace(raw)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a few examples per point (smoke test)")
    ap.add_argument("--tasks", nargs="*", default=["lm", "reason", "infill"])
    ap.add_argument("--respeed", action="store_true",
                    help="measure every recorded speed again (run with nothing else on the machine)")
    args = ap.parse_args()
    if args.quick:
        global OUT
        OUT = OUT.parent / "results-quick"
    torch.manual_seed(0)
    torch.set_num_threads(1)
    if args.respeed:
        return respeed(args.quick)
    done = load_done()
    t0 = time.time()
    for task in args.tasks:
        names = [f"{'reason' if task == 'reason' else 'lm'}-{f}" for f in FAMILIES]
        names += [f"reason-{f}" for f in ADAPT] if task == "reason" else []
        # only finished runs (the final checkpoint exists), so this can run beside the training
        names = [n for n in names if (RUNS / n / "checkpoints" / f"step-{steps_of(*n.split('-', 1)):08d}").is_dir()]
        if task == "infill":
            eval_infill(names, done, args.quick)
            continue
        for name in names:
            (eval_lm if task == "lm" else eval_reason)(name, done, args.quick)
    print(f"[eval] done in {time.time() - t0:.0f} s", flush=True)


if __name__ == "__main__":
    main()
