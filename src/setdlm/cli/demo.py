"""``setdlm demo``: the shipped models at work, offline, in a few minutes on a CPU.

1. a Shakespeare continuation from the SetDLM S≤8 model;
2. a hidden line of held-out Shakespeare filled in by the same model (window w = M, cached context);
3. an arithmetic word problem solved by the SetDLM S≤8 reasoning model;
4. a live table of accuracy, tokens/s, NFE and tokens/step for AR, BD3LM S=4 and SetDLM S≤8 on the same
   problems, threshold off and lower, and the quality-vs-speed plot of it (``OUT/pareto.png``).

``--models DIR`` uses checkpoints named like the shipped ones from ``DIR`` instead (the tests run the demo
on tiny models that way).
"""

from __future__ import annotations

import time
from pathlib import Path

from ..data.tasks import extract_answer
from ..decoding import DecodeSettings
from ..errors import UserError
from ..evaluation import EvalRun, TaskSpec, reports, sweeps, task_examples
from ..evaluation.infill import infill
from ..evaluation.reasoning import reasoning
from ..formats.loading import load
from ..outputs import check_folder

LM, LM_BASELINES = "shakespeare-setdlm-smax8", ("shakespeare-ar", "shakespeare-bd3lm-s4")
REASON = ("arith-ar", "arith-bd3lm-s4", "arith-setdlm-smax8")


def _loader(models: str | Path | None):
    if models is not None:  # a local folder, checked here: never taken for a Hub id
        if not Path(models).is_dir():
            raise UserError(f"models {str(models)!r}: no such folder", fields=("models",))
        lacking = [name for name in (LM, *REASON) if not (Path(models) / name).is_dir()]
        if lacking:
            raise UserError(f"models {str(models)!r} lacks {', '.join(lacking)} (checkpoint folders named like "
                            "the shipped models)", fields=("models",))

    def get(name: str):
        return load(Path(models) / name if models is not None else name)

    return get


def _rule(title: str) -> None:
    print(f"\n== {title} " + "=" * max(0, 76 - len(title)))


def run_demo(models: str | Path | None = None, out: str | Path = "demo", n: int = 24,
             max_new_tokens: int | None = None, progress: bool = True) -> dict:
    """Run the four parts; returns the numbers it printed (the live table as bench points). ``max_new_tokens``:
    the Shakespeare continuation's length (None: min(256, the room), the rule of docs/decoding.md)."""
    if not (isinstance(n, int) and n >= 3):
        raise UserError(f"the demo needs at least 3 problems for its table, got n={n}")
    if max_new_tokens is not None and not (isinstance(max_new_tokens, int) and max_new_tokens >= 1):
        raise UserError(f"max_new_tokens must be a positive integer, got {max_new_tokens!r}")
    check_folder(out)
    get = _loader(models)
    t0 = time.time()
    lm = get(LM)
    result: dict = {}

    _rule("1. Shakespeare, continued by SetDLM S<=8 (window w = D = 4, one token per step)")
    prompt = "ROMEO.\nBut soft, what light"
    g = lm.generate([prompt], max_new_tokens=max_new_tokens, ignore_eos=True, repetition_penalty=1.2)
    print(prompt + g.texts[0])
    print(f"[{len(g.tokens[0])} tokens, {g.nfe} forwards, {g.tokens_per_second:,.0f} tokens/s]")
    result["continuation"] = g.texts[0]

    _rule("2. A hidden line of held-out Shakespeare, infilled by SetDLM S<=8 (w = M = 8)")
    (ex,), _ = task_examples(TaskSpec("infill", data="shakespeare", split="test", n=1, hidden=1, seed=0), [lm])
    filled = infill(lm, [ex], DecodeSettings(window=lm.family.M, repetition_penalty=1.2),
                    EvalRun(batch_size=1, progress=False))
    print(f"{ex.prefix.strip()}\n  >>> {filled.predictions[0].strip()} <<<\n{ex.suffix.strip()}")
    print(f"[original line: {ex.middle.strip()!r}; ROUGE-L {100 * filled.rougeL:.1f}]")
    result["infill"] = filled.predictions[0]

    _rule("3. An arithmetic word problem, solved by SetDLM S<=8")
    solver = get(REASON[-1])
    problems, _ = task_examples(TaskSpec("reasoning", level="medium", split="test", n=n, seed=0), [solver])
    r = reasoning(solver, problems, DecodeSettings(cache_order="reveal"), EvalRun(batch_size=n, progress=False))
    ok = [extract_answer(p) == e.answer for p, e in zip(r.predictions, problems)]
    exact = [p.strip() == e.solution.strip() for p, e in zip(r.predictions, problems)]
    # the first problem it solves step by step, else the first it answers right, else the first
    i = exact.index(True) if any(exact) else (ok.index(True) if any(ok) else 0)
    print(problems[i].question + "\n" + r.predictions[i].strip())
    print(f"[{'correct' if ok[i] else 'wrong'}: the answer is {problems[i].answer}; "
          f"{r.correct} of {n} held-out problems solved]")
    result["solved"] = ok[i]

    _rule(f"4. Live: the same {n} problems, batch 1, on this machine")
    reasoners = [(name, get(name)) for name in REASON]
    points = sweeps.sweep(reasoners, "reasoning", problems, DecodeSettings(cache_order="reveal"),
                          sweeps.BenchSpec(thresholds=(None, 0.9, 0.7), warmup=2, progress=progress))
    print(reports.markdown_table(points))
    result["table"] = [p.to_dict() for p in points]
    out = Path(out)
    try:
        png = reports.plot(points, out / "pareto.png", title=f"arithmetic word problems: accuracy vs speed (n={n})")
        print(f"\nwrote {png}")
        result["plot"] = str(png)
    except ImportError as e:
        print(f"\n(no plot: {e})")
    print(f"demo finished in {time.time() - t0:.0f} s")
    return result
