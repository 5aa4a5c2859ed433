"""Continuous batching is exact: a row decoded in a Session, joining and leaving a running batch between
steps next to rows of other lengths and settings, gives what ``generate`` gives for it alone."""

import pytest
import torch

from setdlm.decoding import applicable_knobs, generate
from setdlm.decoding.session import Session

from support import BOS, CharTokenizer, tiny_model

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
    reqs = _endings(model, [(p, applicable_knobs(family, **kw), at) for p, kw, at in REQUESTS])
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
    assert all(v.shape[0] == 2 for v in st.extra.values())
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
    assert len(s) == 0


def test_serve_guide_session_example_runs():
    """The Python session example of docs/serve.md runs as written (its assert compares with generate)."""
    import re
    from pathlib import Path

    doc = (Path(__file__).parent.parent / "docs" / "serve.md").read_text()
    (code,) = [b for b in re.findall(r"```python\n(.*?)```", doc, flags=re.S) if "Session(" in b]
    exec(compile(code, "docs/serve.md", "exec"), {})
