"""The CFG engine of left-to-right decodes (docs/decoding.md "Two engines"): a JSON Schema setdlm's own automaton
refuses but llguidance compiles is enforced on AR, ``window=1`` and speculative decodes (every output validates;
batched rows decode as alone; the speculative decodes give the left-to-right tokens), refused on set decodes in
one line naming setdlm's reason, and refused as before without llguidance."""

import dataclasses
import json
import sys

import pytest

pytest.importorskip("outlines_core")
pytest.importorskip("llguidance")
jsonschema = pytest.importorskip("jsonschema")

from setdlm import Model  # noqa: E402
from setdlm.data.tokenizers import char_tokenizer, train_bpe  # noqa: E402
from setdlm.decoding import generate  # noqa: E402
from setdlm.decoding.structured.constraint import json_schema, set_bounds  # noqa: E402
from setdlm.decoding.structured.token_bytes import token_bytes  # noqa: E402
from setdlm.decoding.session import Session  # noqa: E402
from setdlm.errors import UserError  # noqa: E402
from setdlm.family import FamilyConfig  # noqa: E402

from support import session_results, tiny  # noqa: E402

CHAR = char_tokenizer(["abc0123456789xyz{}[]\":, -"])
# setdlm refuses: a pattern with a length bound of another shape; two patterns merged (llguidance intersects them)
SCHEMA = {"type": "object", "properties": {
    "x": {"type": "string", "pattern": "^[a-c]+(-[a-c]+)*$", "maxLength": 5},
    "y": {"allOf": [{"type": "string", "pattern": "^[a-c0-9]{1,4}$"}, {"pattern": "[0-9]"}]}},
    "required": ["x", "y"], "additionalProperties": False}
REASON = "'maxLength' at (root)/properties/x"
SAMPLED = dict(temperature=1.0, seed=[1, 2, 3, 4])


def valid(text: str, schema=SCHEMA) -> bool:
    try:
        doc = json.loads(text)
    except json.JSONDecodeError:
        return False
    cls = jsonschema.validators.validator_for(schema)
    return cls(schema, format_checker=cls.FORMAT_CHECKER).is_valid(doc)


def test_only_the_cfg_engine_compiles_it():
    c = json_schema(SCHEMA)
    assert c.engine == "llguidance" and c.pattern is None and REASON in c.refusal
    with pytest.raises(UserError, match="cannot be enforced by the token automaton"):
        json_schema(SCHEMA, cfg=False)
    assert json_schema({"type": "integer", "maximum": 3}).engine == "setdlm"


@pytest.mark.parametrize("knobs", [{}, SAMPLED])
def test_ar_outputs_validate(knobs):
    model = tiny("ar", CHAR, L=64, seed=3)
    prompts = ["a", "b", "c", "x"]
    free = generate(model, prompts, max_new_tokens=40, **knobs)
    assert not any(valid(t) for t in free.texts)  # the random model writes garbage on its own
    out = generate(model, prompts, max_new_tokens=40, constraint=SCHEMA, **knobs)
    assert out.finish_reason == ["eos"] * 4 and all(valid(t) for t in out.texts), out.texts


def test_a_byte_level_bpe_spells_it_across_token_boundaries():
    """Tokens of several characters ("\": \"", "ab-") are read as their bytes by the matcher, as by the automaton."""
    texts = [json.dumps({"x": "ab-c"[: i % 4 + 1], "y": f"a{i}"}) for i in range(200)]
    bpe = train_bpe(texts, 300)
    assert any(len(p) > 2 for p in token_bytes(bpe) if p)
    model = tiny("ar", bpe, L=64, seed=2)
    free = generate(model, ["a", "b", "c"], max_new_tokens=40, temperature=1.0, seed=[1, 2, 3])
    assert not any(valid(t) for t in free.texts)
    out = generate(model, ["a", "b", "c"], max_new_tokens=40, constraint=SCHEMA, temperature=1.0, seed=[1, 2, 3])
    assert out.finish_reason == ["eos"] * 3 and all(valid(t) for t in out.texts), out.texts


def test_batched_rows_decode_as_alone():
    """Each row has its own matcher: a batch with a free row and a row of the automaton's decodes as alone."""
    model = tiny("ar", CHAR, L=64, seed=4)
    own = json_schema({"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 3})
    prompts, cons, seeds = ["a", "b", "c", "x"], [SCHEMA, None, own, SCHEMA], [5, 6, 7, 8]
    out = generate(model, prompts, max_new_tokens=30, constraint=cons, temperature=1.0, seed=seeds)
    for p, c, s, text in zip(prompts, cons, seeds, out.texts):
        assert generate(model, [p], max_new_tokens=30, constraint=c, temperature=1.0, seed=s).texts == [text]
    assert valid(out.texts[0]) and valid(out.texts[3]) and out.texts[0] != out.texts[3]


def test_session_rows_joining_between_steps_decode_as_alone():
    """The server's continuous batching: each row's matcher is copied when it joins a state."""
    model = tiny("ar", CHAR, L=64, seed=4)
    s = Session(model, width=64)
    first = s.add("a", max_new_tokens=30, constraint=SCHEMA)
    s.step()
    s.step()
    second = s.add("b", max_new_tokens=30, constraint=SCHEMA, temperature=1.0, seed=3)
    done = session_results(s)
    got = [CHAR.decode(done[first].tokens), CHAR.decode(done[second].tokens)]
    assert got == [generate(model, ["a"], max_new_tokens=30, constraint=SCHEMA).texts[0],
                   generate(model, ["b"], max_new_tokens=30, constraint=SCHEMA, temperature=1.0, seed=3).texts[0]]
    assert all(valid(t) for t in got)


def test_setdlm_left_to_right_decodes_use_it_and_set_decodes_are_refused_in_one_line():
    m = tiny("setdlm", CHAR, L=64, seed=3)
    model = Model(m.backbone, dataclasses.replace(m.family, ar_weight=1.0), CHAR)
    ref = generate(model, ["a", "b"], max_new_tokens=40, constraint=SCHEMA, window=1)
    assert all(valid(t) for t in ref.texts), ref.texts
    spec = generate(model, ["a", "b"], max_new_tokens=40, constraint=SCHEMA, window=4, speculate=True)
    assert spec.tokens == ref.tokens  # drafts consumed tentatively and rolled back: the window=1 tokens
    kw = dict(max_new_tokens=40, constraint=SCHEMA, temperature=1.0, seed=[3, 4])
    sampled = generate(model, ["a", "b"], window=1, **kw)
    assert generate(model, ["a", "b"], window=4, speculate=True, **kw).tokens == sampled.tokens
    assert all(valid(t) for t in sampled.texts), sampled.texts
    ar = Model(m.backbone, FamilyConfig("ar", m.family.length, CHAR.mask_token_id), CHAR)
    out = generate(model, ["a", "b"], max_new_tokens=40, constraint=SCHEMA, window=4, speculate="next_token")
    assert out.tokens == generate(ar, ["a", "b"], max_new_tokens=40, constraint=SCHEMA).tokens
    assert all(valid(t) for t in out.texts), out.texts
    mdlm = tiny("mdlm", CHAR, L=64, seed=5)
    assert all(valid(t) for t in generate(mdlm, ["a", "b"], max_new_tokens=40, constraint=SCHEMA, block_size=1).texts)
    for fam, knobs in [(model, dict(window=4)), (mdlm, dict(block_size=4))]:
        with pytest.raises(UserError, match="only left-to-right decodes") as e:
            generate(fam, ["a"], max_new_tokens=40, constraint=SCHEMA, **knobs)
        assert REASON in str(e.value) and "llguidance" in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(UserError, match="needs EOS to end the output"):
        generate(tiny("ar", CHAR, L=64), ["a"], max_new_tokens=40, constraint=SCHEMA, ignore_eos=True)


def test_a_compile_bound_hands_left_to_right_decodes_to_the_cfg_engine():
    schema = {"type": "object", "properties": {"x": {"enum": ["abc", "cab", "bca"]}, "z": {"type": "integer",
              "minimum": 0, "maximum": 999}}, "required": ["x", "z"], "additionalProperties": False}
    assert json_schema(schema).engine == "setdlm"
    old = set_bounds(edges=20)  # the automaton of this schema has more token transitions
    try:
        out = generate(tiny("ar", CHAR, L=64, seed=3), ["a", "b"], max_new_tokens=30, constraint=schema)
        assert all(valid(t, schema) for t in out.texts), out.texts
        with pytest.raises(UserError, match="exceeds the size bound.*only left-to-right decodes"):
            generate(tiny("setdlm", CHAR, L=64), ["a"], max_new_tokens=30, constraint=schema, window=4)
    finally:
        set_bounds(**dataclasses.asdict(old))


def test_without_llguidance_the_old_refusal_stands(monkeypatch):
    monkeypatch.setitem(sys.modules, "llguidance", None)  # import llguidance raises ImportError
    with pytest.raises(UserError) as e:
        json_schema(SCHEMA)
    assert REASON in str(e.value) and "llguidance" not in str(e.value) and "CFG" not in str(e.value)


def test_the_cli_json_schema_uses_the_same_engines(tmp_path, capsys):
    from support import assert_one_line_error, run

    tiny("ar", CHAR, L=64, seed=3).save(tmp_path / "ar")
    tiny("setdlm", CHAR, L=64, seed=3).save(tmp_path / "set")
    code, stdout, err = run(["generate", str(tmp_path / "ar"), "--prompt", "a", "--max-new-tokens", "40",
                             "--json-schema", json.dumps(SCHEMA)], capsys)
    assert code == 0 and valid(stdout.strip()), (stdout, err)
    code, _, err = run(["generate", str(tmp_path / "set"), "--prompt", "a", "--max-new-tokens", "40",
                        "--json-schema", json.dumps(SCHEMA)], capsys)
    assert_one_line_error(code, err, "only left-to-right decodes")
    assert REASON in err
