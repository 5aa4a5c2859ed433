"""The streamed text: what is sent at each step is final (a prefix of the answer's text), never a half
character or the start of a stop string, and the pieces join to exactly the non-streamed text."""

import random

import pytest

pytest.importorskip("starlette")

from setdlm.decoding.output import StepTrace  # noqa: E402
from setdlm.decoding.session import prepare  # noqa: E402
from setdlm.decoding.state import stop_index  # noqa: E402
from setdlm.formats.loading import load  # noqa: E402
from setdlm.serve.responses import TextStream  # noqa: E402


@pytest.fixture(scope="module")
def model():
    return load("shakespeare-setdlm-smax8")  # its byte-level BPE splits é, — and ö into several tokens


@pytest.mark.parametrize("shuffled", [True, False])
@pytest.mark.parametrize("stop, eos_at", [(None, None), ("wö", None), (None, 9), ("zzz", 5)])
def test_commits_stream_a_growing_prefix_of_the_final_text(model, stop, eos_at, shuffled):
    tok = model.tokenizer
    gen = tok.encode(" héllo — wörld, and so on") + tok.encode(" more")
    if eos_at is not None:
        gen[eos_at] = tok.eos_token_id
    row = prepare(model, "ROMEO:", max_new_tokens=len(gen), stop=stop)
    start = row.prompt_length
    # the final text as generate reports it: cut before an EOS, then before a stop string
    ids = gen[: gen.index(tok.eos_token_id)] if eos_at is not None else gen
    final = tok.decode(ids)
    if stop and stop_index(final, (stop,)) is not None:
        final = final[: stop_index(final, (stop,))]
    order = list(range(len(gen)))
    if shuffled:
        random.Random(0).shuffle(order)  # commits in a random order, 1 to 3 per step
    stream, sent, k = TextStream(tok, row), [], 0
    while k < len(order):
        n = 1 + k % 3 if shuffled else 1  # left to right: every prefix, half characters too
        pos = sorted(order[k:k + n])
        k += n
        trace = StepTrace([], [start + p for p in pos], [gen[p] for p in pos], [0.5] * len(pos),
                          [start + p for p in pos], [gen[p] for p in pos], 0)
        sent.append(stream.update(trace))
        joined = "".join(sent)
        assert final.startswith(joined)  # only final text is sent
        assert "\ufffd" not in joined
        if stop:
            assert stop not in joined
    sent.append(stream.finish(final))
    assert "".join(sent) == final
    assert any(sent[:-1])  # text did flow before the end
