"""Every output of the CFG engine valid or refused (docs/decoding.md "Two engines"): llguidance's rows close their
document within ``max_new_tokens`` (a closing is written once the positions left come within the reserve of it; a token
after which none fits gives way to it: tests/decoding/test_constraint_cfg_closing.py), and a request whose empty output
has no closing that fits is refused before decoding. A ConstraintCompiler keeps the refusals of its compile bounds, so a
schema past a bound fails fast on the next request. Speculative decodes of a schema llguidance serves give the plain
left-to-right outputs."""

import dataclasses

import pytest

pytest.importorskip("outlines_core")
pytest.importorskip("llguidance")
pytest.importorskip("jsonschema")

from setdlm import Model  # noqa: E402
from setdlm.decoding import generate  # noqa: E402
from setdlm.decoding.structured.constraint import (  # noqa: E402
    Bounds, CompileBound, ConstraintCompiler, json_schema, regex, time_limit)
from setdlm.decoding.session import Session  # noqa: E402
from setdlm.errors import UserError  # noqa: E402
from setdlm.family import FamilyConfig  # noqa: E402

from support import session_results, tiny  # noqa: E402
# SCHEMA: only llguidance compiles it; its shortest document, {"x":"a","y":"0"}, has 17 characters
from test_constraint_cfg import CHAR, SCHEMA, valid  # noqa: E402

# an optional property whose value needs 37 characters at least: one token (its key's quote) grows the closing
# past the reserve (tests/decoding/test_constraint_cfg_closing.py)
GROWS = {"type": "object", "properties": {
    "x": {"type": "object", "properties": {k: {"type": "string", "pattern": "^[a-c]+(-[a-c]+)*$", "maxLength": 5}
                                           for k in ("aaaa", "bbbb", "cccc")},
          "required": ["aaaa", "bbbb", "cccc"], "additionalProperties": False},
    "y": {"type": "integer"}}, "additionalProperties": False}
PROMPTS = ["a", "b", "c", "x", "y", "z"]
SAMPLED = dict(temperature=1.0, seed=list(range(6)))


@pytest.mark.parametrize("knobs", [{}, SAMPLED])
@pytest.mark.parametrize("budget", [17, 18, 20, 24])
def test_tight_budgets_close_the_document(budget, knobs):
    """Before, these rows ended mid-document (finish_reason "length", '{ "x": "cb","y" :'): the model had not
    closed it by then, and the matcher alone allows any prefix."""
    assert json_schema(SCHEMA).engine == "llguidance"
    out = generate(tiny("ar", CHAR, L=64, seed=3), PROMPTS, max_new_tokens=budget, constraint=SCHEMA, **knobs)
    assert all(valid(t) for t in out.texts), out.texts
    assert set(out.finish_reason) <= {"eos", "length"}, out.finish_reason


def test_a_budget_no_document_fits_is_refused_before_decoding():
    with pytest.raises(UserError, match="no match of at most 16 tokens"):
        generate(tiny("ar", CHAR, L=64, seed=3), ["a"], max_new_tokens=16, constraint=SCHEMA)


def test_speculative_decodes_under_a_tight_budget_give_the_left_to_right_outputs():
    m = tiny("setdlm", CHAR, L=64, seed=3)
    model = Model(m.backbone, dataclasses.replace(m.family, ar_weight=1.0), CHAR)
    ar = Model(m.backbone, FamilyConfig("ar", m.family.length, CHAR.mask_token_id), CHAR)
    for knobs in ({}, dict(temperature=1.0, seed=[3, 4, 5])):
        kw = dict(max_new_tokens=20, constraint=SCHEMA, **knobs)
        ref = generate(model, PROMPTS[:3], window=1, **kw)
        assert all(valid(t) for t in ref.texts), ref.texts
        assert generate(model, PROMPTS[:3], window=4, speculate=True, **kw).tokens == ref.tokens
        plain = generate(ar, PROMPTS[:3], **kw)
        nxt = generate(model, PROMPTS[:3], window=4, speculate="next_token", **kw)
        assert nxt.tokens == plain.tokens and all(valid(t) for t in nxt.texts), nxt.texts


class Counting:
    """A compiler's workers, counted: each call that reaches a compiling process."""

    def __init__(self, workers, reply=None):
        self.workers, self.reply, self.calls = workers, reply, 0

    def run(self, *args):
        self.calls += 1
        return self.reply if self.reply is not None else self.workers.run(*args)


def test_a_compile_bound_refusal_is_kept_and_left_to_right_decodes_take_llguidance_at_once():
    schema = {"type": "object", "properties": {"x": {"enum": ["abc", "cab", "bca"]}, "z": {"type": "integer",
              "minimum": 0, "maximum": 999}}, "required": ["x", "z"], "additionalProperties": False}
    strict = ConstraintCompiler(Bounds(edges=20))  # this schema's automaton has more token transitions
    counted = strict._workers = Counting(strict._workers)
    s = Session(tiny("ar", CHAR, L=64, seed=3), width=64, compiler=strict)
    rows = [s.add(p, max_new_tokens=30, constraint=schema, temperature=1.0, seed=i) for i, p in enumerate("ab")]
    assert counted.calls == 1  # the second row's refusal came from the cache, not another compile
    done = session_results(s)
    assert all(valid(CHAR.decode(done[r].tokens[:-1]), schema) for r in rows), [done[r] for r in rows]
    with pytest.raises(CompileBound, match="exceeds the size bound"):
        strict.automaton(json_schema(schema), CHAR, 30)
    assert counted.calls == 1
    strict.set_bounds(edges=20_000_000)  # a larger bound: compiled again
    assert strict.automaton(json_schema(schema), CHAR, 30).states > 1 and counted.calls == 2


def test_a_time_refusal_is_kept_for_no_more_time_and_a_wait_is_not_kept():
    hard = regex("[ab]*a[ab]{20}")
    strict = ConstraintCompiler(Bounds(seconds=1))
    # the compiling process's answer scripted (what it says when a compile passes its time bound), so that the
    # test does not depend on how fast this machine compiles
    counted = strict._workers = Counting(None, ("bound", "took more than the time bound (1 s)", "seconds"))
    for seconds in (1, 1, 0.5):
        with time_limit(seconds), pytest.raises(CompileBound, match="took more than the time bound"):
            strict.automaton(hard, CHAR)
    assert counted.calls == 1
    strict.set_bounds(seconds=2)  # more time: tried again
    with pytest.raises(CompileBound, match="time bound"):
        strict.automaton(hard, CHAR)
    assert counted.calls == 2
    busy = ConstraintCompiler()
    busy._workers = Counting(None, ("bound", "waited 30 s for a free compiler (time bound)", "wait"))
    for _ in range(2):
        with pytest.raises(CompileBound, match="waited"):
            busy.automaton(regex("[ab]{3}"), CHAR)
    assert busy._workers.calls == 2  # the load's doing, not the pattern's: asked again
