"""What the CFG engine's closings cost a decode (docs/decoding.md "Two engines"; benchmarks/RESULTS.md, issue #48):
SmolLM2-135M-Instruct (int8) writes a JSON document for a few SchemaStore schemas only llguidance compiles, greedy,
AR and with its drafter (``speculate="next_token"``); per decode the tokens, seconds, tokens/s, the greedy closings
searched (``GrammarRow._closing``: calls and seconds) and, where the code has them, the tokens vetoed
(``GrammarRow.vet`` returning another token). Run it on two checkouts to compare (``PYTHONPATH`` picks the code).

    PYTHONPATH=src python benchmarks/cfg_closing_cost.py --max-tokens 128
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

# the first llguidance-only ones (json_schema's engine) of SchemaStore's schemas shuffled by random.Random(0)
SCHEMAS = ("https://raw.githubusercontent.com/hadolint/hadolint/master/contrib/hadolint.json",
           "https://json.schemastore.org/band-manifest.json", "https://json.schemastore.org/bitrise.json",
           "https://jenkins-x.io/schemas/jx-schema.json", "https://unpkg.com/@graphql-mesh/types@0.72.3/config-schema.json",
           "https://json.schemastore.org/appsettings.json", "https://json.schemastore.org/liquibase-3.2.json",
           "https://json.schemastore.org/eslintrc.json")


class Counted:
    """Wraps a method of a class, counting its calls and seconds (and the calls whose result ``changed`` says)."""

    def __init__(self, cls, name: str, changed=None):
        self.calls, self.seconds, self.changes, self.changed = 0, 0.0, 0, changed
        inner = getattr(cls, name)

        def wrapped(row, *args):
            t = time.perf_counter()
            out = inner(row, *args)
            self.seconds += time.perf_counter() - t
            self.calls += 1
            self.changes += bool(self.changed and self.changed(args, out))
            return out

        setattr(cls, name, wrapped)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--decodes", default="ar,drafter", help="ar, drafter (speculate='next_token'), comma-separated")
    ap.add_argument("--schemas", type=int, default=4, help="how many of SCHEMAS, in order (at most 8)")
    args = ap.parse_args()
    sys.path.insert(0, os.path.dirname(__file__))
    import jsonschema

    import setdlm
    from schema_coverage import store_schemas
    from setdlm.chat import chat_prompt
    from setdlm.decoding.structured.cfg import GrammarRow
    from setdlm.decoding.structured.constraint import json_schema

    closing = Counted(GrammarRow, "_closing")
    vetoed = Counted(GrammarRow, "vet", lambda a, out: out != a[1]) if hasattr(GrammarRow, "vet") else None
    by_url = {u: s for u, _, s in store_schemas()}
    loads = {"ar": ("smollm2-135m", {}), "drafter": ("smollm2-135m-draft", {"speculate": "next_token"})}
    for name in args.decodes.split(","):
        model, knobs = setdlm.load(loads[name][0], quantize="int8"), loads[name][1]
        for url in SCHEMAS[:args.schemas]:
            schema = by_url[url]
            c = json_schema(schema)
            assert c.engine == "llguidance", url
            ask = f"Write a JSON document valid against this JSON Schema:\n{json.dumps(schema)[:1500]}"
            before = (closing.calls, closing.seconds, vetoed.changes if vetoed else None)
            t = time.perf_counter()
            try:
                out = model.generate([chat_prompt(model.tokenizer, ask)], max_new_tokens=args.max_tokens,
                                     constraint=c, **knobs)
            except ValueError as e:  # no document of at most --max-tokens tokens: refused before decoding
                print(json.dumps({"decode": name, "schema": url.rsplit("/", 1)[-1], "refused": str(e)[-80:]}))
                continue
            s = time.perf_counter() - t
            cls = jsonschema.validators.validator_for(schema)
            try:
                valid = cls(schema, format_checker=cls.FORMAT_CHECKER).is_valid(json.loads(out.texts[0]))
            except json.JSONDecodeError:
                valid = False
            n = len(out.tokens[0])
            print(json.dumps({"decode": name, "schema": url.rsplit("/", 1)[-1], "tokens": n, "seconds": round(s, 2),
                              "tokens_per_s": round(n / s, 2), "finish": out.finish_reason[0], "valid": valid,
                              "closings": closing.calls - before[0],
                              "closing_s": round(closing.seconds - before[1], 2),
                              "vetoed": None if vetoed is None else vetoed.changes - before[2],
                              "text": out.texts[0][:60]}), flush=True)


if __name__ == "__main__":
    main()
