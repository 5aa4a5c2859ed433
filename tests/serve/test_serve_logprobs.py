"""Logprobs through the server (issue #45 point 1; docs/serve.md "Logprobs"): a generated token's
log-probability is that of the distribution it was committed from (AR: the next-token distribution, exact;
a set decoder: its step's conditional, the step named in ``setdlm.token_steps``), alternatives sorted and
consistent, streamed == whole; the prompt's with ``echo`` are the left-to-right conditionals of one forward
(AR: exactly ``setdlm eval --task likelihood``'s figure), batched == alone."""

import json
import math
import urllib.request

import pytest
import torch

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
openai = pytest.importorskip("openai")

from setdlm.batch import Batch  # noqa: E402
from setdlm.decoding import generate  # noqa: E402
from setdlm.evaluation.likelihood import likelihood  # noqa: E402
from setdlm.objectives import ar_loss, log_probs, setdlm_loss  # noqa: E402

from support import CharTokenizer, openai_client, post_json, running, tiny_model  # noqa: E402

TEMPLATE = "{% for m in messages %}{{ m.role }}: {{ m.content }} {% endfor %}assistant:"


def _model(family: str):
    m = tiny_model(family, L=48, seed=3)
    m.tokenizer = CharTokenizer()
    m.tokenizer.chat_template = TEMPLATE
    return m


@pytest.fixture(scope="module")
def ar():
    model = _model("ar")
    with running(model, "ar") as (url, _):
        yield url, model


@pytest.fixture(scope="module")
def sd():
    model = _model("setdlm")
    with running(model, "sd") as (url, _):
        yield url, model


post, client = post_json, openai_client


def _next_token_logprobs(model, ids: list[int]) -> torch.Tensor:
    """(n, V): log p(· | ids[:i]) for i = 1..n, one causal forward (the AR model's exact conditionals)."""
    x = torch.tensor([ids])
    pos = torch.arange(len(ids))[None]
    mask = torch.ones(len(ids), len(ids), dtype=torch.bool).tril()[None, None]
    with torch.no_grad():
        return log_probs(model.backbone(x, pos, mask), model.family.mask_token_id)[0]


def test_ar_generated_logprobs_are_the_next_token_distribution(ar):
    url, model = ar
    out = client(url).completions.create(model="ar", prompt="to be", max_tokens=8, logprobs=3, extra_body={
        "ignore_eos": True})
    lp = out.choices[0].logprobs
    alone = generate(model, "to be", max_new_tokens=8, ignore_eos=True)
    ids = [1] + model.tokenizer.encode("to be") + alone.tokens[0]
    exact = _next_token_logprobs(model, ids)
    n = len(ids) - 8
    assert len(lp.token_logprobs) == 8 and lp.tokens == [model.tokenizer.decode([t]) for t in alone.tokens[0]]
    for j, (t, got, top) in enumerate(zip(alone.tokens[0], lp.token_logprobs, lp.top_logprobs)):
        row = exact[n + j - 1]
        assert got == pytest.approx(float(row[t]), abs=1e-6)
        values = list(top.values())
        assert got == max(values)  # greedy: the chosen token is the most probable, the same figure
        best = row.topk(3).values.tolist()
        assert sorted(values, reverse=True) == pytest.approx(best[:len(values)], abs=1e-6)
        assert sum(math.exp(v) for v in values) <= 1 + 1e-9
    assert out.model_extra["setdlm"]["token_steps"] == list(range(8))


def test_chat_logprobs_and_stream_equal_the_whole_answer(ar):
    url, model = ar
    msgs = [{"role": "user", "content": "hi"}]
    out = client(url).chat.completions.create(model="ar", messages=msgs, max_tokens=6, logprobs=True, top_logprobs=2,
                                              temperature=0.8, seed=4)
    content = out.choices[0].logprobs.content
    assert "".join(c.token for c in content) == out.choices[0].message.content
    for c in content:
        tops = [t.logprob for t in c.top_logprobs]
        assert tops == sorted(tops, reverse=True) and len(tops) == 2 and c.bytes == list(c.token.encode())
        assert c.logprob <= tops[0] + 1e-12
    streamed = list(client(url).chat.completions.create(model="ar", messages=msgs, max_tokens=6, logprobs=True,
                                                        top_logprobs=2, temperature=0.8, seed=4, stream=True))
    parts = [c for ch in streamed if ch.choices[0].logprobs for c in ch.choices[0].logprobs.content]
    assert [(c.token, c.logprob) for c in parts] == [(c.token, c.logprob) for c in content]
    chunks = list(client(url).completions.create(model="ar", prompt="to be", max_tokens=7, logprobs=2, stream=True,
                                                 temperature=0.5, seed=1))
    whole = client(url).completions.create(model="ar", prompt="to be", max_tokens=7, logprobs=2, temperature=0.5,
                                           seed=1).choices[0].logprobs
    assert sum((ch.choices[0].logprobs.token_logprobs for ch in chunks if ch.choices[0].logprobs), []) == \
        whole.token_logprobs
    assert sum((ch.choices[0].logprobs.text_offset for ch in chunks if ch.choices[0].logprobs), []) == \
        whole.text_offset


def test_set_decoder_logprobs_are_the_committing_steps_conditionals(sd):
    url, model = sd
    body = {"prompt": "to be", "max_tokens": 10, "threshold": 0.2, "logprobs": 2, "ignore_eos": True}
    status, out = post(url, body)
    assert status == 200, out
    trace = generate(model, "to be", max_new_tokens=10, threshold=0.2, ignore_eos=True, trace=True).trace[0]
    start = 6
    by_pos = {p: (k, c) for k, t in enumerate(trace) for p, c in zip(t.query_positions, t.confidences)
              if p in t.committed_positions}
    lp = out["choices"][0]["logprobs"]
    steps = out["setdlm"]["token_steps"]
    for j, (got, step) in enumerate(zip(lp["token_logprobs"], steps)):
        k, conf = by_pos[start + j]
        assert step == k and got == pytest.approx(math.log(conf), abs=1e-9)
    assert max(steps) == len(trace) - 1 and len(set(steps)) < len(steps)  # sets of several tokens per step
    streamed = [json.loads(line[6:]) for line in _sse(url, {**body, "stream": True}) if line != "data: [DONE]"]
    got = sum((e["choices"][0]["logprobs"]["token_logprobs"] for e in streamed if e["choices"][0]["logprobs"]), [])
    assert got == lp["token_logprobs"] and streamed[-1]["setdlm"]["token_steps"] == steps


def _sse(url: str, body: dict) -> list[str]:
    req = urllib.request.Request(url + "/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        return [line for line in r.read().decode().split("\n") if line.startswith("data: ")]


def test_ar_echoed_prompt_logprobs_are_the_likelihood(ar):
    """The sum of the echoed logprobs is the AR likelihood ``setdlm eval --task likelihood`` computes
    (``evaluation.likelihood.likelihood``: nats per token times tokens); a list of prompts scores each as alone."""
    url, model = ar
    prompts = ["to be or not to be", "a cat", "the quick brown fox"]
    status, out = post(url, {"prompt": prompts, "max_tokens": 0, "echo": True, "logprobs": 1})
    assert status == 200, out
    for p, c in zip(prompts, out["choices"]):
        ids = [1] + model.tokenizer.encode(p)
        lp = c["logprobs"]
        assert c["text"] == p and lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
        summary = likelihood(model, [torch.tensor([ids])], progress=False)
        assert summary.tokens == len(ids) - 1
        assert sum(lp["token_logprobs"][1:]) == pytest.approx(-summary.nats, abs=1e-9)
        status, one = post(url, {"prompt": p, "max_tokens": 0, "echo": True, "logprobs": 1})
        alone = one["choices"][0]["logprobs"]["token_logprobs"]
        assert alone[0] is None and alone[1:] == pytest.approx(lp["token_logprobs"][1:], abs=1e-12)  # batched == alone
        for v, top in zip(lp["token_logprobs"][1:], lp["top_logprobs"][1:]):
            assert v <= max(top.values()) + 1e-12


def test_echo_with_a_generated_token_is_what_lm_eval_sends(ar):
    """lm-eval's local-completions loglikelihood request: token ids, ``echo``, ``logprobs: 1``, ``max_tokens:
    1``: the prompt's logprobs, then the generated token's."""
    url, model = ar
    ids = [1] + model.tokenizer.encode("to be or")
    status, out = post(url, {"prompt": ids, "echo": True, "logprobs": 1, "max_tokens": 1, "temperature": 0})
    assert status == 200, out
    lp = out["choices"][0]["logprobs"]
    assert len(lp["token_logprobs"]) == len(ids) + 1
    nll = ar_loss(model.backbone, Batch(torch.tensor([ids]), torch.ones(1, len(ids), dtype=torch.bool)),
                  model.family.mask_token_id).nll[0]
    assert lp["token_logprobs"][1:len(ids)] == pytest.approx((-nll[1:]).tolist(), abs=1e-9)
    assert lp["text_offset"][0] == 0 and out["choices"][0]["text"].startswith("to be or")


def test_setdlm_echo_is_the_two_stream_forward_in_left_to_right_order(sd):
    url, model = sd
    ids = [1] + model.tokenizer.encode("to be or not")
    status, out = post(url, {"prompt": ids, "echo": True, "logprobs": 0, "max_tokens": 0})
    assert status == 200, out
    order = torch.arange(len(ids))[None]
    batch = Batch(torch.tensor([ids]), torch.ones(1, len(ids), dtype=torch.bool))
    with torch.no_grad():
        nll = setdlm_loss(model.backbone, batch, model.family.mask_token_id, order=order).nll[0]
    assert out["choices"][0]["logprobs"]["token_logprobs"][1:] == pytest.approx((-nll[1:]).tolist(), abs=1e-9)


def test_echo_logprobs_are_refused_where_no_order_defines_them():
    for family in ("mdlm", "bd3lm"):
        with running(_model(family), family) as (url, _):
            status, err = post(url, {"prompt": "to be", "echo": True, "logprobs": 1, "max_tokens": 1})
            assert status == 400 and err["error"]["param"] == "echo", err
            status, out = post(url, {"prompt": "to be", "logprobs": 1, "max_tokens": 4})
            assert status == 200 and len(out["choices"][0]["logprobs"]["token_logprobs"]) >= 1, out


def test_generated_logprobs_batched_equal_alone(sd):
    """Three prompts decoded together (one request, rows of one group) give each the logprobs it gets alone."""
    url, _ = sd
    prompts = ["to be", "a cat sat", "xy"]
    body = {"max_tokens": 8, "threshold": 0.3, "logprobs": 3, "temperature": 0.7, "seed": 2}
    status, out = post(url, {"prompt": prompts, **body})
    assert status == 200, out
    for p, c in zip(prompts, out["choices"]):
        _, one = post(url, {"prompt": p, **body})
        alone = one["choices"][0]["logprobs"]
        assert c["text"] == one["choices"][0]["text"]
        assert c["logprobs"]["token_logprobs"] == pytest.approx(alone["token_logprobs"], abs=1e-9)
        for got, want in zip(c["logprobs"]["top_logprobs"], alone["top_logprobs"]):
            assert list(got) == list(want) and list(got.values()) == pytest.approx(list(want.values()), abs=1e-9)


def test_speculative_logprobs_are_the_verifiers_distribution():
    """``speculate: "next_token"`` on a model with a next-token head: each token's logprob and alternatives are the
    next-token distribution of its own weights, exactly (the causal forward of the clean stream); ``speculate:
    true``: the ``window=1`` decode's, step for step."""
    from setdlm import Model
    from setdlm.family import FamilyConfig

    plain = _model("setdlm")
    model = Model(plain.backbone, FamilyConfig("setdlm", 48, plain.family.mask_token_id, D=2, ar_weight=1.0),
                  plain.tokenizer)
    with running(model, "spec") as (url, _):
        status, out = post(url, {"prompt": "to be or", "max_tokens": 12, "ignore_eos": True, "window": 4,
                                 "speculate": "next_token", "logprobs": 3})
        assert status == 200, out
        lp = out["choices"][0]["logprobs"]
        alone = generate(model, "to be or", max_new_tokens=12, ignore_eos=True, window=4, speculate="next_token")
        ids = [1] + model.tokenizer.encode("to be or") + alone.tokens[0]
        exact = _next_token_logprobs(model, ids)
        n = len(ids) - 12
        for j, (got, top) in enumerate(zip(lp["token_logprobs"], lp["top_logprobs"])):
            row = exact[n + j - 1]
            assert got == pytest.approx(float(row[ids[n + j]]), abs=1e-6)
            assert got == pytest.approx(float(row.max()), abs=1e-9)  # greedy: the verifier's argmax
            best = row.topk(3).values.tolist()  # (the dict's keys are token texts: tokens of one text share one)
            assert all(min(abs(v - b) for b in best) < 1e-6 for v in top.values())
        status, spec = post(url, {"prompt": "to be or", "max_tokens": 12, "ignore_eos": True, "window": 4,
                                  "speculate": True, "logprobs": 2})
        status, one = post(url, {"prompt": "to be or", "max_tokens": 12, "ignore_eos": True, "window": 1,
                                 "logprobs": 2})
        assert spec["choices"][0]["text"] == one["choices"][0]["text"]
        assert spec["choices"][0]["logprobs"]["token_logprobs"] == pytest.approx(
            one["choices"][0]["logprobs"]["token_logprobs"], abs=1e-9)
        assert [list(t) for t in spec["choices"][0]["logprobs"]["top_logprobs"]] == \
            [list(t) for t in one["choices"][0]["logprobs"]["top_logprobs"]]
