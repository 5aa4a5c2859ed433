"""Constrained decoding (docs/decoding.md "Constrained decoding"): the allowed sets are exactly the tokens that
keep the canvas completable (checked against brute force), and every output of every family matches its
regex / validates against its JSON Schema / is one of its choices, for random regexes and random tiny models
(whose unconstrained outputs are garbage), thresholds off..0.5 and several windows."""

import itertools
import json
import random
import re

import pytest
import torch

pytest.importorskip("outlines_core")
jsonschema = pytest.importorskip("jsonschema")

from setdlm import load  # noqa: E402
from setdlm.data.tasks import reasoning_split  # noqa: E402
from setdlm.data.tokenizers import char_tokenizer, train_bpe  # noqa: E402
from setdlm.decoding import fill, generate, infill  # noqa: E402
from setdlm.decoding.structured.enforce import RowConstraint, keep_jointly  # noqa: E402
from setdlm.decoding.structured.constraint import automaton, choice, json_object, json_schema, regex  # noqa: E402
from setdlm.decoding.structured.token_bytes import token_bytes  # noqa: E402
from setdlm.decoding.settings import DecodeSettings  # noqa: E402

from support import tiny  # noqa: E402

ALPHABET = "abc01"
CHAR = char_tokenizer([ALPHABET + "xyzesno{}[]\":, -"])  # more characters than the regexes use: garbage is likely
BPE = train_bpe(["".join(random.Random(i).choice(ALPHABET + " ") for _ in range(400)) for i in range(40)], 300)


def random_regex(rng: random.Random, depth: int = 2, alphabet: str = ALPHABET,
                 classes=("[a-c]", "[01]", "[ab0]")) -> str:
    """A regex over ``alphabet`` in the syntax Python's re and Rust's regex read alike."""
    def atom(d):
        r = rng.random()
        if d > 0 and r < 0.25:
            return "(" + alt(d - 1) + ")"
        if r < 0.45:
            return rng.choice(classes)
        return rng.choice(alphabet)

    def piece(d):
        return atom(d) + rng.choice(["", "", "", "?", "*", "+", "{1,3}", "{2}"])

    def alt(d):
        seqs = ["".join(piece(d) for _ in range(rng.randint(1, 3))) for _ in range(rng.choice([1, 1, 2]))]
        return "|".join(seqs)

    return alt(depth)


def settings_for(family: str, rng: random.Random) -> dict:
    th = rng.choice([None, 0.05, 0.2, 0.5])
    if family == "ar":
        return {}
    if family == "setdlm":
        return {"threshold": th, "window": rng.choice([1, 2, 4, 8])}
    return {"threshold": th, "block_size": rng.choice([2, 4, 8])}


@pytest.mark.parametrize("family", ["setdlm", "ar", "mdlm", "bd3lm"])
def test_random_regexes_always_match_on_random_models(family):
    rng = random.Random(f"regex-{family}")
    n = valid_free = 0
    for case in range(10):
        tok = CHAR if case % 2 else BPE
        model = tiny(family, tok, L=64, seed=case)
        c = regex(random_regex(rng))
        kw = settings_for(family, rng)
        prompts = ["a", "b0 1"]
        try:
            out = generate(model, prompts, max_new_tokens=16, constraint=c, seed=case, **kw)
        except ValueError as e:  # the only refusal: no match fits the budget
            assert "no match of at most 16 tokens" in str(e), e
            continue
        free = generate(model, prompts, max_new_tokens=16, seed=case, **kw)
        for text, reason, ids in zip(out.texts, out.finish_reason, out.tokens):
            assert re.fullmatch(c.pattern, text), (c.pattern, text, reason, kw, family)
            assert reason in ("eos", "length") and len(ids) <= 16
            n += 1
        valid_free += sum(bool(re.fullmatch(c.pattern, t)) for t in free.texts)
        assert out.nfe >= 1
    assert n >= 10 and valid_free <= n // 2, (n, valid_free)  # unconstrained: mostly garbage


def test_allowed_sets_are_exactly_the_completable_tokens():
    """Brute force over every completion of random canvases (any token at each hole, EOS included; the EOS id
    special, absent, or a letter, which then only ends the text), each completion's text checked by Python's
    ``re.fullmatch`` (not by outlines-core, whose automaton drops the ways on from a match: ``a(bc)?``)."""
    tok = char_tokenizer(["ab"])
    V, eos, mask = tok.vocab_size, tok.eos_token_id, tok.mask_token_id
    letters = {tok.encode(ch)[0]: ch for ch in "ab"}
    rng = random.Random(0)
    tokens = [t for t in range(V) if t != mask]
    checked = 0
    for case in range(24):
        pattern = random_regex(rng, alphabet="ab", classes=("[ab]", "[a]"))
        n = 5
        end_id = [eos, None, tok.encode("b")[0], None][case % 4]  # the EOS id: special, none, or a letter
        canvas = [rng.choice(tokens) if rng.random() < 0.35 else None for _ in range(n)]

        def valid(w):
            end = w.index(end_id) if end_id in w else n
            if not all(t in letters for t in w[:end]):
                return False
            return re.fullmatch(pattern, "".join(letters[t] for t in w[:end])) is not None

        holes = [i for i, t in enumerate(canvas) if t is None]
        want = {i: set() for i in holes}
        some = False
        for fill_in in itertools.product(tokens, repeat=len(holes)):
            w = list(canvas)
            for i, t in zip(holes, fill_in):
                w[i] = t
            if valid(w):
                some = True
                for i, t in zip(holes, fill_in):
                    want[i].add(t)
        rc = RowConstraint(regex(pattern), automaton(regex(pattern), tok), 0, n, () if end_id is None else (end_id,))
        region = [0 if t is None else t for t in canvas]
        is_hole = [t is None for t in canvas]
        assert rc.completable(region, is_hole) == some, (pattern, canvas)
        if not holes:
            continue
        got = rc.allowed(region, is_hole, holes, V)
        for k, i in enumerate(holes):
            assert {t for t in tokens if got[k, t]} == want[i], (pattern, canvas, i)
            checked += 1
    assert checked > 20


def test_a_committed_set_is_kept_only_as_far_as_it_fits_together():
    tok = char_tokenizer(["ab"])
    a, b = tok.encode("a")[0], tok.encode("b")[0]
    rc = RowConstraint(regex("ab|ba"), automaton(regex("ab|ba"), tok), 0, 2, ())
    canvas = torch.full((1, 3), tok.mask_token_id)
    masked = torch.tensor([[True, True, False]])
    allowed = rc.allowed([0, 0], [True, True], [0, 1], tok.vocab_size)
    assert allowed[0, a] and allowed[0, b] and allowed[1, a] and allowed[1, b]  # each alone is fine
    commit = keep_jointly([rc], canvas, masked, torch.tensor([[0, 1]]), torch.tensor([[a, a]]),
                          torch.tensor([[0.6, 0.9]]), torch.tensor([[True, True]]))
    assert commit.tolist() == [[False, True]]  # "aa" is no match: the less confident one waits
    # end to end: a threshold that commits the whole window every step still gives matches only
    for seed in range(12):
        model = tiny("setdlm", tok, L=32, seed=seed)
        out = generate(model, ["a", "b"], max_new_tokens=4, window=4, threshold=1e-6, constraint=regex("(ab|ba){2}"),
                       ignore_eos=True)
        assert all(re.fullmatch("(ab|ba){2}", t) for t in out.texts), out.texts


@pytest.mark.parametrize("family", ["setdlm", "ar", "mdlm", "bd3lm"])
def test_json_schema_and_choice_on_random_models(family):
    schema = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "array", "items": {"enum": ["x", "y"]}}},
              "required": ["a", "b"], "additionalProperties": False}
    rng = random.Random(family)
    for seed in range(3):
        model = tiny(family, CHAR if seed % 2 else BPE, L=96, seed=seed)
        kw = settings_for(family, rng)
        out = generate(model, ["a", "1"], max_new_tokens=40, constraint=json_schema(schema), seed=seed, **kw)
        for text in out.texts:
            jsonschema.validate(json.loads(text), schema)
        opts = ["yes", "no", "a01", "b"]
        out = generate(model, ["a", "1", "b"], max_new_tokens=6, constraint=choice(opts), seed=seed, **kw)
        assert all(t in opts for t in out.texts), out.texts


def test_infill_constrains_the_middle_only():
    for family in ("setdlm", "ar", "mdlm", "bd3lm"):
        model = tiny(family, CHAR, L=48, seed=3)
        out = infill(model, ["{x", "yy"], ["}", "z"], [6, 5], constraint=regex("[01]+ (a|b)"))
        assert all(re.fullmatch("[01]+ (a|b)", t) for t in out.texts), out.texts
        assert out.sequences[0][:3] == [CHAR.bos_token_id] + CHAR.encode("{x") and out.finish_reason == ["done"] * 2
    # several gaps: the constraint spans from the first to the last MASK, context between them included
    M = CHAR.mask_token_id
    a, one = CHAR.encode("a")[0], CHAR.encode("1")[0]
    out = fill(tiny("setdlm", CHAR, L=48, seed=4), [[CHAR.bos_token_id, M, M, a, M, M, one, M]],
               constraint=regex("[ab]+1?[01]+"))
    assert re.fullmatch("[ab]+1?[01]+", CHAR.decode(out.sequences[0][1:]))
    with pytest.raises(ValueError, match="cannot be matched by the 7 tokens from the first to the last MASK"):
        fill(tiny("setdlm", CHAR, L=48, seed=4), [[CHAR.bos_token_id, M, M, a, M, M, one, M]], constraint=regex("[01]+"))


def test_each_row_has_its_own_constraint_or_none():
    model = tiny("setdlm", CHAR, L=64, seed=5)
    prompts = ["a", "b", "c"]
    c0, c2 = regex("a+1"), choice(["xyz", "zz"])
    out = generate(model, prompts, max_new_tokens=10, constraint=[c0, None, c2], threshold=0.2)
    alone = generate(model, ["b"], max_new_tokens=10, threshold=0.2)
    assert re.fullmatch("a+1", out.texts[0]) and out.texts[2] in ("xyz", "zz")
    assert out.tokens[1] == alone.tokens[0]  # a free row decodes exactly as without any constraint
    with pytest.raises(ValueError, match="constraint has 2 entries, one per row, but 3 rows"):
        generate(model, prompts, max_new_tokens=4, constraint=[c0, None])


def test_unsatisfiable_and_bad_constraints_are_clear_errors_before_decoding():
    model = tiny("setdlm", CHAR, L=64)
    with pytest.raises(ValueError, match=r"row 1: regex\('a\{12\}'\) has no match of at most 8 tokens"):
        generate(model, ["a", "b"], max_new_tokens=8, constraint=[None, regex("a{12}")])
    with pytest.raises(ValueError, match="and without EOS, exactly that many"):
        generate(model, ["a"], max_new_tokens=3, constraint=regex("ab"), ignore_eos=True)
    with pytest.raises(ValueError, match="cannot be spelled with this tokenizer's tokens"):
        generate(model, ["a"], max_new_tokens=8, constraint=regex("q+"))  # no 'q' in the vocabulary
    with pytest.raises(ValueError, match="invalid regular expression|cannot be spelled"):
        generate(model, ["a"], max_new_tokens=8, constraint=regex("(a"))
    with pytest.raises(ValueError, match="json_schema: invalid schema at type"):
        json_schema({"type": "bogus"})
    with pytest.raises(ValueError, match="not valid JSON"):
        json_schema("{nope")
    with pytest.raises(ValueError, match=r"'multipleOf' at \(root\)/properties/a cannot be enforced"):
        json_schema({"type": "object", "properties": {"a": {"type": "integer", "multipleOf": 3}}}, cfg=False)
    with pytest.raises(ValueError, match=r"'uniqueItems' at \(root\)/\$defs/t/anyOf/1 cannot be enforced"):
        json_schema({"$defs": {"t": {"anyOf": [{"type": "null"}, {"type": "array", "uniqueItems": True}]}},
                     "$ref": "#/$defs/t"})
    with pytest.raises(ValueError, match="'oneOf' at \\(root\\) cannot be enforced .*may overlap"):
        json_schema({"oneOf": [{"type": "integer"}, {"type": "number"}]})
    with pytest.raises(ValueError, match="give constraint or stop"):
        DecodeSettings(constraint=regex("a"), stop=".")
    with pytest.raises(TypeError, match="constraint must be made by"):
        DecodeSettings(constraint="a+")
    with pytest.raises(ValueError, match="every choice must be a non-empty string"):
        choice(["a", ""])


def test_the_text_is_the_concatenation_of_the_token_bytes():
    """The automaton reads a token as the bytes it adds to the text: true of byte-level BPE and characters."""
    shakespeare = load("shakespeare-ar").tokenizer
    for tok in (BPE, CHAR, shakespeare):
        pieces = token_bytes(tok)
        for text in ["ab 01 ba", "O Romeo, Romeo! wherefore art thou — Romeo?", "{\"a\": [1, 2]}"]:
            ids = [i for i in tok.encode(text) if pieces[i] is not None]
            assert tok.decode(ids).encode() == b"".join(pieces[i] for i in ids)


@pytest.mark.parametrize("name", ["arith-setdlm-smax8", "arith-bd3lm-s4", "arith-ar"])
def test_shipped_models_follow_the_solution_format(name):
    """The arithmetic models' tokenizers spell no JSON: their own worked-solution format, as a regex."""
    model = load(name)
    fmt = r"([0-9]+[-+*][0-9]+=[0-9]+\n){1,4}#### [0-9]+"
    prompts = [e.prompt for e in reasoning_split("test", 4, level="easy")]
    for kw in shipped_settings(model.family.family):
        out = generate(model, prompts, max_new_tokens=80, constraint=regex(fmt), **kw)
        assert all(re.fullmatch(fmt, t) for t in out.texts), (kw, out.texts)


@pytest.mark.parametrize("name", ["shakespeare-setdlm-smax8", "shakespeare-bd3lm-s4", "shakespeare-ar"])
def test_shipped_models_write_json_and_choices(name):
    model = load(name)
    schema = {"type": "object", "properties": {"speaker": {"type": "string", "maxLength": 12},
                                               "act": {"enum": [1, 2, 3, 4, 5]}},
              "required": ["speaker", "act"], "additionalProperties": False}
    for kw in shipped_settings(model.family.family):
        out = generate(model, ["ROMEO:\n", "Enter"], max_new_tokens=40, constraint=json_schema(schema), **kw)
        for text in out.texts:
            jsonschema.validate(json.loads(text), schema)
        out = generate(model, ["ROMEO:\n"], max_new_tokens=6, constraint=choice(["Ay.", "No, sir.", "Anon!"]), **kw)
        assert out.texts[0] in ("Ay.", "No, sir.", "Anon!")


def shipped_settings(family: str) -> list[dict]:
    """Thresholds off..0.5 and several windows (SetDLM) or block sizes (BD3LM)."""
    if family == "ar":
        return [{}]
    if family == "setdlm":
        return [{"threshold": None}, {"threshold": 0.5}, {"threshold": 0.2, "window": 8}, {"window": 2}]
    return [{"threshold": None}, {"threshold": 0.5}]


def test_session_rows_with_different_constraints_share_forwards():
    from setdlm.decoding.session import Session

    model = tiny("setdlm", CHAR, L=64, seed=6)
    session = Session(model, width=32)
    cs = [regex("a+1"), None, choice(["xyz", "zz"])]
    ids = [session.add(p, max_new_tokens=10, threshold=0.2, constraint=c) for p, c in zip("abc", cs)]
    done = {}
    while len(session):
        done.update({ev.row: ev.done for ev in session.step() if ev.done is not None})
    assert len(session.groups) == 0 and session.forwards == max(d.nfe for d in done.values())  # one group
    for rid, p, c in zip(ids, "abc", cs):
        alone = generate(model, [p], max_new_tokens=10, threshold=0.2, constraint=c)
        assert done[rid].tokens == alone.tokens[0] and done[rid].text == alone.texts[0]
    assert re.fullmatch("a+1", done[ids[0]].text) and done[ids[2]].text in ("xyz", "zz")


def test_constrained_rows_survive_a_step_that_fails_for_their_group_mate():
    """Constrained rows share a state with an unconstrained row whose step fails (the backbone raises on a
    token at a position only that row commits): each constrained row is decoded again alone, its constraint
    starting afresh, and ends as it does alone, matching its constraint."""
    from setdlm.decoding.session import Session

    from support import committed_only_by, failing

    model = tiny("setdlm", CHAR, L=64, seed=6)
    rows = [("a", regex("a+1")), ("bcd", None), ("c", choice(["xyz", "zz"]))]
    kw = dict(max_new_tokens=10, threshold=None)  # one token a step
    # the step that fails comes after the constrained rows have committed two tokens each
    at, tok = committed_only_by(model, [(p, dict(kw, constraint=c)) for p, c in rows], 1, first_step=2)
    session = Session(failing(model, lambda call, ids, pos: bool(((ids == tok) & (pos == at)).any())), width=32)
    ids = [session.add(p, constraint=c, **kw) for p, c in rows]
    done, errors = {}, {}
    while len(session):
        for ev in session.step():
            if ev.error is not None:
                errors[ev.row] = ev
            elif ev.done is not None:
                done[ev.row] = ev.done
    assert list(errors) == [ids[1]] and errors[ids[1]].step >= 3
    for rid, (p, c) in zip(ids[::2], rows[::2]):
        alone = generate(model, [p], constraint=c, **kw)
        assert done[rid].tokens == alone.tokens[0] and done[rid].text == alone.texts[0]
    assert re.fullmatch("a+1", done[ids[0]].text) and done[ids[2]].text in ("xyz", "zz")


def test_cli_generate_takes_a_regex_a_json_schema_or_choices(tmp_path, capsys):
    from support import assert_one_line_error, run, save_tiny

    ckpt = save_tiny(tmp_path / "m")
    out = tmp_path / "o.jsonl"
    code, _, err = run(["generate", ckpt, "--prompt", "a", "--prompt", "b", "--max-new-tokens", "12",
                        "--regex", "[ab]+ c", "--output", str(out)], capsys)
    assert code == 0, err
    assert all(re.fullmatch("[ab]+ c", json.loads(line)["text"]) for line in out.read_text().splitlines())
    schema = tmp_path / "s.json"
    schema.write_text(json.dumps({"type": "string", "enum": ["a b", "cab"]}))  # the tokenizer has no '"': unspellable
    code, _, err = run(["generate", ckpt, "--prompt", "a", "--json-schema", str(schema)], capsys)
    assert_one_line_error(code, err, "cannot be spelled with this tokenizer's tokens")
    code, stdout, err = run(["generate", ckpt, "--prompt", "a", "--choice", "cab", "--choice", "b a", "--max-new-tokens",
                             "6"], capsys)
    assert code == 0 and stdout.strip() in ("cab", "b a"), (stdout, err)
    code, _, err = run(["generate", ckpt, "--prompt", "a", "--json-schema", '{"type": "bogus"}'], capsys)
    assert_one_line_error(code, err, "--json-schema: invalid schema at type")
    code, _, err = run(["generate", ckpt, "--prompt", "a", "--regex", "a", "--choice", "b"], capsys)
    assert_one_line_error(code, err, "give one of --regex, --json-schema, --choice")


def test_json_object_nesting_is_bounded_by_max_depth():
    one, two = json_object(max_depth=1).pattern, json_object().pattern
    assert re.fullmatch(one, '{"a": 1, "b": "x"}') and not re.fullmatch(one, '{"a": [1]}')
    assert re.fullmatch(two, '{"a": {"b": 1}, "c": [true, null]}') and not re.fullmatch(two, '{"a": {"b": {"c": 1}}}')
    model = tiny("bd3lm", BPE, L=96, seed=1)
    for text in generate(model, ["a", "b"], max_new_tokens=48, constraint=json_object(), threshold=0.2).texts:
        assert isinstance(json.loads(text), dict)


def test_a_constraint_that_allows_the_free_output_changes_nothing_for_ar():
    """AR: masking only tokens the model does not pick leaves every argmax, so every token, as it was. (The
    diffusion decoders rank positions by the probability among the allowed tokens, so there a constraint
    that never binds may still change which position is committed first.)"""
    specials = CHAR.special_ids - {CHAR.eos_token_id}
    compared = 0
    for seed in range(4):
        model = tiny("ar", CHAR, L=64, seed=seed)
        free = generate(model, ["a", "b0", "zz"], max_new_tokens=12)
        out = generate(model, ["a", "b0", "zz"], max_new_tokens=12, constraint=regex(r"[\s\S]*"))
        for f, c in zip(free.tokens, out.tokens):
            if not specials & set(f):
                assert c == f
                compared += 1
    assert compared >= 4


def test_an_eos_that_is_also_a_text_token_ends_the_output_only_where_it_may():
    """EOS = the newline token: committing it ends the output, so it is allowed only where the automaton
    accepts, never as the newline the regex allows inside."""
    tok = char_tokenizer(["ab\n"])
    a, b, nl = (tok.encode(ch)[0] for ch in "ab\n")
    c = regex("a\n?b")
    rc = RowConstraint(c, automaton(c, tok), 0, 3, (nl,))
    allowed = rc.allowed([a, 0, 0], [False, True, True], [1, 2], tok.vocab_size)
    assert allowed[0, b] and not allowed[0, nl]  # "a" alone does not match: no EOS yet
    assert allowed[1, nl] and not allowed[1, b]  # only "ab" + EOS: "a" + newline-as-text + "b" cannot be
    for seed in range(4):
        out = generate(tiny("setdlm", tok, L=32, seed=seed), ["a"], max_new_tokens=4, constraint=c, eos_token_id=nl,
                       threshold=0.3)
        assert out.texts[0] == "ab" and out.finish_reason[0] == "eos"


def test_the_trace_shows_where_the_constraint_chose_the_token():
    from setdlm.decoding.output import step_record

    model = tiny("setdlm", CHAR, L=64, seed=2)
    free = generate(model, ["a"], max_new_tokens=12, trace=True)
    out = generate(model, ["a"], max_new_tokens=12, trace=True, constraint=regex("x[01]{3}z+"), threshold=0.2)
    assert not any(t.constrained_positions for t in free.trace[0])
    forced = [p for t in out.trace[0] for p in t.constrained_positions]
    assert forced and all(set(t.constrained_positions) <= set(t.committed_positions) for t in out.trace[0])
    records = [step_record(t, k, 2, CHAR) for k, t in enumerate(out.trace[0])]
    assert sorted(p for r in records for p in r.get("constrained", [])) == sorted(p - 2 for p in forced)


@pytest.mark.parametrize("w", [2, 4])
def test_speculate_with_a_constraint_is_the_constrained_left_to_right_output_in_fewer_forwards(w):
    """Drafts and verifiers masked by the reachability of the prefix each sees: token for token the constrained
    window=1 output (greedy and seeded sampling, EOS ending rows early), and the forced stretches of a schema
    (its keys, its punctuation) are drafted right, so fewer forwards."""
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 6},
                                               "n": {"type": "integer", "minimum": 0, "maximum": 120}},
              "required": ["name", "n"], "additionalProperties": False}
    model = tiny("setdlm", char_tokenizer(["abcdefghijklmnopqrstuvwxyz0123456789{}[]\":, -"]), L=96, seed=4)
    cons = [json_schema(schema), regex("[ab]{2,5}-(yes|no)"), None]
    for knobs in ({}, {"temperature": 1.0, "seed": 3}):
        ref = generate(model, ["a", "b", "c"], max_new_tokens=40, window=1, constraint=cons, **knobs)
        out = generate(model, ["a", "b", "c"], max_new_tokens=40, window=w, speculate=True, constraint=cons, **knobs)
        assert out.tokens == ref.tokens and out.texts == ref.texts and out.finish_reason == ref.finish_reason
        jsonschema.validate(json.loads(out.texts[0]), schema)
        assert re.fullmatch("[ab]{2,5}-(yes|no)", out.texts[1])
        assert out.row_nfe[0] < ref.row_nfe[0] and out.nfe < ref.nfe
        mid = dict(lengths=9, constraint=regex("[a-c]+-(yes|no)"), **knobs)  # infill: exactly 9 tokens, context after
        ref = infill(model, ["a", "b"], ["xyz", "zz"], window=1, **mid)
        out = infill(model, ["a", "b"], ["xyz", "zz"], window=w, speculate=True, **mid)
        assert out.tokens == ref.tokens and all(re.fullmatch("[a-c]+-(yes|no)", t) for t in out.texts)


def test_decoding_takes_the_schema_and_the_command_line_reads_its_file(tmp_path):
    """No file is read inside decoding: ``json_schema`` takes a dict or its text (a path is not JSON); the
    command line's ``--json-schema FILE`` is read by ``setdlm.cli.options.constraint_from_flags``."""
    from setdlm.cli.options import constraint_from_flags
    from setdlm.decoding.structured import constraint
    from setdlm.errors import UserError, as_flags

    schema = {"type": "string", "enum": ["ab", "c"]}
    path = tmp_path / "s.json"
    path.write_text(json.dumps(schema))
    with pytest.raises(UserError, match="json_schema: the schema is not valid JSON"):
        json_schema(str(path))
    assert not hasattr(constraint, "of_options")
    inline = constraint_from_flags(json_schema=json.dumps(schema))
    assert constraint_from_flags(json_schema=str(path)) == json_schema(schema) == inline
    with pytest.raises(UserError) as e:
        constraint_from_flags(json_schema=str(tmp_path / "none.json"))
    assert as_flags(e.value) == f"--json-schema file '{tmp_path / 'none.json'}' does not exist"
    with pytest.raises(UserError, match="give one of regex, json_schema, choice, not regex and json_schema"):
        constraint_from_flags(regex="a", json_schema=str(tmp_path / "none.json"))  # the conflict first, as before
    assert constraint_from_flags() is None and constraint_from_flags(choice=["a", "b"]) == choice(["a", "b"])
