"""Continuous batching is exact: a row decoded in a Session, joining and leaving a running batch between
steps next to rows of other lengths and settings, gives what ``generate`` gives for it alone."""

import dataclasses

import pytest
import torch

from setdlm.decoding import applicable, generate
from setdlm.decoding.session import Session

from support import BOS, CharTokenizer, committed_only_by, failing, tiny_model

FAMILIES = ["ar", "mdlm", "bd3lm", "setdlm"]
SAMPLED = dict(temperature=0.9, top_p=0.9, top_k=20, repetition_penalty=1.3)

# (prompt, settings, step at which it is added): different lengths, settings, seeds and join times
REQUESTS = [
    ("to be or", dict(max_new_tokens=9, threshold=0.3), 0),
    ("a", dict(max_new_tokens=14, threshold=0.3), 0),
    ("the quick brown", dict(max_new_tokens=6, seed=3, **SAMPLED), 0),
    ("hello there", dict(max_new_tokens=12, threshold=0.3), 2),  # joins the first group mid-decode
    ("x", dict(max_new_tokens=8, seed=11, threshold=0.5, **SAMPLED), 3),
    ("", dict(max_new_tokens=10, threshold=0.3), 4),  # gets a stop string (see _endings)
    ("hello there", dict(max_new_tokens=12, threshold=0.3), 5),  # the same request again, later
    ("the quick brown", dict(max_new_tokens=6, seed=3, **SAMPLED), 6),
]


def _model(family):
    m = tiny_model(family, L=40, seed=2)
    m.tokenizer = CharTokenizer()
    return m


def _endings(model, requests):
    """An EOS that some rows generate and others do not, and a stop string for row 5, so that rows stop at
    different steps for different reasons."""
    outs = [generate(model, p, ignore_eos=True, **kw).tokens[0] for p, kw, _ in requests]
    eos = next(t for row in outs for t in row if not all(t in r for r in outs) and t != 3)
    stop = next(model.tokenizer.decode([t]) for t in outs[5][2:] if t not in (eos, 3))
    return [(p, dict(kw, eos_token_id=eos, **({"stop": stop} if i == 5 else {})), at)
            for i, (p, kw, at) in enumerate(requests)]


def _drive(session, requests, cancel_at=None):
    """Add each request at its step; step until every row finished. Returns row → (done, trace steps)."""
    rows, done, seen, t = {}, {}, {}, 0
    while len(done) + len(cancel_at or {}) < len(requests):
        for i, (p, kw, at) in enumerate(requests):
            if at == t:
                rows[session.add(p, **kw)] = i
        for row, (when, _) in (cancel_at or {}).items():
            if when == t:
                session.cancel(row)
        for ev in session.step():
            seen.setdefault(rows[ev.row], []).append(ev)
            assert ev.step == len(seen[rows[ev.row]]) - 1
            if ev.done is not None:
                done[rows[ev.row]] = ev.done
        t += 1
        assert t < 200
    assert len(session) == 0 and not session.groups
    return done, seen


@pytest.mark.parametrize("family", FAMILIES)
def test_rows_joining_and_leaving_decode_as_alone(family):
    model = _model(family)
    reqs = _endings(model, [(p, applicable(family, **kw), at) for p, kw, at in REQUESTS])
    done, seen = _drive(Session(model), reqs)
    reasons = set()
    for i, (p, kw, _) in enumerate(reqs):
        alone = generate(model, p, trace=True, **kw)
        d = done[i]
        assert d.tokens == alone.tokens[0], i
        assert d.text == alone.texts[0]
        assert d.finish_reason == alone.finish_reason[0]
        assert d.nfe == alone.row_nfe[0] == len(seen[i])
        assert d.committed == alone.row_committed[0]
        for got, want in zip([e.trace for e in seen[i]], alone.trace[0]):  # same sets; float noise aside
            assert got.committed_positions == want.committed_positions
            assert got.committed_tokens == want.committed_tokens and got.candidates == want.candidates
            assert got.input_positions == want.input_positions and got.cache_length == want.cache_length
            assert got.confidences == pytest.approx(want.confidences, rel=1e-9)
        reasons.add(d.finish_reason)
    assert {"eos", "length"} <= reasons  # rows did leave the batch at different times


@pytest.mark.parametrize("family", FAMILIES)
def test_infilling_rows_decode_as_infill_alone(family):
    """Rows with a suffix (prompt + MASK × n + suffix) next to generating rows: each infilled middle is what
    ``infill`` gives for it alone."""
    from setdlm.decoding import infill

    model = _model(family)
    s = Session(model)
    reqs = [("to be", " the end", dict(max_new_tokens=6, threshold=0.3)),
            ("a", "zz", applicable(family, max_new_tokens=9, seed=4, **SAMPLED)),
            ("or not", None, dict(max_new_tokens=8, threshold=0.3)),
            ("xy", ".", dict(max_new_tokens=5, threshold=0.3))]
    rows = {s.add(p, suffix=suf, **applicable(family, **kw)): i for i, (p, suf, kw) in enumerate(reqs)}
    done = {}
    while len(s):
        for ev in s.step():
            assert ev.error is None
            if ev.done is not None:
                done[rows[ev.row]] = ev.done
    for i, (p, suf, kw) in enumerate(reqs):
        kw = applicable(family, **kw)
        if suf is None:
            assert done[i].tokens == generate(model, p, **kw).tokens[0]
            continue
        n = kw.pop("max_new_tokens")
        alone = infill(model, [p], [suf], n, **kw)
        assert done[i].tokens == alone.tokens[0] and done[i].text == alone.texts[0]
        assert done[i].finish_reason == "done" and len(done[i].tokens) == n


def test_rows_share_forwards_per_setting():
    """Rows of one setting decode in one batch: the session's forwards are far fewer than the rows' total."""
    model = _model("setdlm")
    reqs = [(p, dict(max_new_tokens=10, threshold=0.3, ignore_eos=True), at)
            for at, p in enumerate(["ab", "cd", "ef", "gh"])]
    s = Session(model)
    done, _ = _drive(s, reqs)
    assert s.forwards < sum(d.nfe for d in done.values())
    assert s.forwards == max(at + done[i].nfe for i, (_, _, at) in enumerate(reqs))  # one forward per step


def test_cancelled_row_frees_its_place_and_others_are_unchanged():
    model = _model("setdlm")
    reqs = [(p, dict(max_new_tokens=12, threshold=0.3), 0) for p in ["to be", "or not", "to be or"]]
    s = Session(model)
    # row 1 is cancelled after 2 steps
    done, seen = _drive(s, reqs, cancel_at={1: (2, None)})
    assert 1 not in done and len(seen[1]) == 2
    for i in (0, 2):
        assert done[i].tokens == generate(model, reqs[i][0], **reqs[i][1]).tokens[0]


def test_extend_joins_every_per_row_field():
    """DecodeState.extend must grow every per-row tensor (a field added to the state and missed here
    would make joined rows read another row's data)."""
    model = _model("setdlm")
    s = Session(model)
    s.add("ab", max_new_tokens=5, repetition_penalty=1.2)
    s.step()
    s.add("cdef", max_new_tokens=7, repetition_penalty=1.2)
    s._admit()
    (st,) = s.groups.values()
    assert st.batch == 2
    for name, v in vars(st).items():
        if isinstance(v, torch.Tensor) and name != "pos":  # pos: the canvas columns, shared by all rows
            assert v.shape[0] == 2, name
    assert all(getattr(st.extra, f.name).shape[0] == 2 for f in dataclasses.fields(st.extra))
    assert st.cache.batch == 2 and len(st.traces) == 2 and st.seen.shape[0] == 2


def test_add_rejects_bad_rows():
    s = Session(_model("setdlm"))
    with pytest.raises(ValueError, match="exceed the context length 40"):
        s.add("a" * 30, max_new_tokens=20)
    with pytest.raises(ValueError, match="max_new_tokens"):
        s.add("a", max_new_tokens=0)
    with pytest.raises(ValueError, match="threshold"):
        s.add("a", threshold=2.0, max_new_tokens=4)
    with pytest.raises(ValueError, match="window"):
        s.add("a", window=0, max_new_tokens=4)
    with pytest.raises(ValueError, match="MASK"):
        s.add([BOS, 47], max_new_tokens=4)
    with pytest.raises(ValueError, match=r"seed must lie in \[-2\*\*63, 2\*\*64 - 1\].*18446744073709551616"):
        s.add("a", max_new_tokens=4, seed=2**64, temperature=0.5)
    with pytest.raises(ValueError, match="seed must lie"):
        s.add("a", max_new_tokens=4, seed=-2**63 - 1)  # checked even when greedy
    with pytest.raises(TypeError, match="seed must be an int.*True"):
        s.add("a", max_new_tokens=4, seed=True, temperature=0.5)
    assert len(s) == 0


def test_generate_checks_seeds_to_torchs_range():
    model = _model("setdlm")
    edge = generate(model, "ab", max_new_tokens=4, temperature=0.9, seed=2**64 - 1)  # torch's largest seed
    assert edge.tokens == generate(model, "ab", max_new_tokens=4, temperature=0.9, seed=2**64 - 1).tokens
    with pytest.raises(ValueError, match=r"seed\[1\] must lie"):
        generate(model, ["ab", "cd"], max_new_tokens=4, temperature=0.9, seed=[1, 2**64])  # seed[1] named
    with pytest.raises(TypeError, match="seed must be an int.*False"):
        generate(model, "ab", max_new_tokens=4, temperature=0.9, seed=False)


POISON = "x"  # a character the tiny model never generates for the prompts below (checked)


def test_a_row_whose_prefill_fails_fails_alone():
    """Three rows of one setting join together; the backbone fails on any input holding the poisoned
    character, so their joint prefill fails: it is retried row by row, and only the poisoned row fails."""
    plain = _model("setdlm")
    p = plain.tokenizer.encode(POISON)[0]
    model = failing(plain, lambda call, ids, pos: bool((ids == p).any()))
    kw = dict(max_new_tokens=10, threshold=0.3)
    s = Session(model)
    rows = [s.add(q, **kw) for q in ("to be", "or " + POISON, "not")]
    done, errors = {}, {}
    while len(s):
        for ev in s.step():
            if ev.error is not None:
                errors[ev.row] = ev.error
            elif ev.done is not None:
                done[ev.row] = ev.done
    assert list(errors) == [rows[1]] and "RuntimeError" in errors[rows[1]]
    for row, q in ((rows[0], "to be"), (rows[2], "not")):
        alone = generate(plain, q, **kw)
        assert p not in alone.tokens[0]
        assert done[row].tokens == alone.tokens[0]


# (prompt, settings, step at which it is added): group A samples (a seed per row), group B is greedy; the
# poisoned row (index 1) shares group A with rows that joined before and after it
GROUP_A = dict(max_new_tokens=12, threshold=0.3, **SAMPLED)
GROUP_B = dict(max_new_tokens=10, threshold=0.5)
STEP_FAILS = [("to be", dict(GROUP_A, seed=1), 0), ("or not", dict(GROUP_A, seed=2), 1),
              ("the cat", dict(GROUP_A, seed=3), 3), ("to be", GROUP_B, 0), ("hello", GROUP_B, 2)]


@pytest.mark.parametrize("family", FAMILIES)
def test_a_row_whose_step_fails_fails_alone(family):
    """Rows of one setting share a state; the backbone raises on any input holding a token that only the
    poisoned row generates, so the group's step fails once that row has committed it. Only that row fails
    (at its own step, its earlier steps reported as usual); its group-mates, which joined before and after
    it, and the other group, finish with exactly the tokens, texts and steps they get alone and in a
    session without the poisoned row."""
    plain = _model(family)
    reqs = [(p, applicable(family, **kw), at) for p, kw, at in STEP_FAILS]
    at, poison = committed_only_by(plain, [(p, kw) for p, kw, _ in reqs], 1)
    model = failing(plain, lambda call, ids, pos: bool(((ids == poison) & (pos == at)).any()))
    done, seen, errors = _drive_failing(Session(model), reqs)
    assert list(errors) == [1] and "decoding failed: RuntimeError" in errors[1].error
    alone = generate(plain, reqs[1][0], trace=True, **reqs[1][1])
    first = next(k for k, t in enumerate(alone.trace[0]) if at in t.committed_positions)
    assert errors[1].step == len(seen[1]) > first  # its steps up to the one that failed, reported once each
    assert [e.trace.committed_tokens for e in seen[1]] == [t.committed_tokens for t in alone.trace[0][: len(seen[1])]]
    without, _, _ = _drive_failing(Session(plain), [r for i, r in enumerate(reqs) if i != 1])
    for i, (p, kw, _) in enumerate(reqs):
        if i == 1:
            continue
        alone = generate(plain, p, trace=True, **kw)
        d = done[i]
        assert d.tokens == alone.tokens[0] == without[i - (i > 1)].tokens and d.text == alone.texts[0], i
        assert d.nfe == alone.row_nfe[0] == len(seen[i]) and d.finish_reason == alone.finish_reason[0]
        assert [e.trace.committed_tokens for e in seen[i]] == [t.committed_tokens for t in alone.trace[0]]


def _drive_failing(session, requests):
    """``_drive`` that also collects failed rows: (done, events per row, error event per failed row)."""
    rows, done, seen, errors, t = {}, {}, {}, {}, 0
    while len(done) + len(errors) < len(requests):
        for i, (p, kw, at) in enumerate(requests):
            if at == t:
                rows[session.add(p, **kw)] = i
        for ev in session.step():
            i = rows[ev.row]
            if ev.error is not None:
                errors[i] = ev
                continue
            seen.setdefault(i, []).append(ev)
            assert ev.step == len(seen[i]) - 1  # one event per step, in order, none repeated
            if ev.done is not None:
                done[i] = ev.done
        t += 1
        assert t < 200
    assert len(session) == 0 and not session.groups
    return done, seen, errors


def test_a_group_whose_step_fails_for_every_row_fails_them_all_and_no_other():
    """The forward of the first group's second step raises, and so does every later forward of its rows,
    stepped again alone: its rows fail at that step; the other group's rows finish exactly as alone."""
    plain = _model("setdlm")
    # forwards: prefill A (1), prefill B (2), step A (3), step B (4), step A (5) <- fails, and from then on
    # every forward holding A's first prompt characters ("q", "z" after the BOS): each row's prefill again
    marks = torch.tensor([plain.tokenizer.encode(c)[0] for c in "qz"])
    model = failing(plain, lambda call, ids, pos: call == 5 or (call > 5 and bool((torch.isin(ids, marks)
                                                                                   & (pos == 1)).any())))
    a, b = dict(max_new_tokens=10, threshold=0.3), dict(max_new_tokens=10, threshold=0.5)
    s = Session(model)
    rows = [s.add("qua", **a), s.add("zoo", **a), s.add("to be", **b), s.add("or not", **b)]
    done, errors = {}, {}
    while len(s):
        for ev in s.step():
            if ev.error is not None:
                errors[ev.row] = (ev.step, ev.error)
            elif ev.done is not None:
                done[ev.row] = ev.done
    assert sorted(errors) == rows[:2] and all(step == 1 for step, _ in errors.values())
    assert done[rows[2]].tokens == generate(plain, "to be", **b).tokens[0]
    assert done[rows[3]].tokens == generate(plain, "or not", **b).tokens[0]
    assert len(s) == 0 and not s.groups


def test_serve_guide_session_example_runs():
    """The Python session example of docs/serve.md runs as written (its assert compares with generate)."""
    import re
    from pathlib import Path

    from support import SRC

    doc = (Path(SRC).parent / "docs" / "serve.md").read_text()
    (code,) = [b for b in re.findall(r"```python\n(.*?)```", doc, flags=re.S) if "Session(" in b]
    exec(compile(code, "docs/serve.md", "exec"), {})
