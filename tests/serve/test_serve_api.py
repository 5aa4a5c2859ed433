"""The OpenAI-compatible server on loopback: the official ``openai`` client reads plain and streamed answers,
concurrent requests of different lengths and settings each get what ``generate`` gives them alone, bad
requests get a 4xx naming the field while the server keeps serving, a full queue answers 429, a client
that goes away frees its row."""

import http.client
import json
import threading
import urllib.error
import urllib.request

import pytest

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
openai = pytest.importorskip("openai")

from setdlm.chat import chat_prompt  # noqa: E402
from setdlm.decoding import generate  # noqa: E402

from support import CharTokenizer, committed_only_by, failing, gated, running, tiny_model  # noqa: E402

TEMPLATE = "{% for m in messages %}{{ m.role }}: {{ m.content }} {% endfor %}assistant:"


def _model():
    m = tiny_model("setdlm", L=48, seed=2)
    m.tokenizer = CharTokenizer()
    m.tokenizer.chat_template = TEMPLATE
    return m


@pytest.fixture(scope="module")
def server():
    model = _model()
    with running(model, "tiny", max_batch=4) as (url, app):
        yield url, model, app


def post(url: str, body, path="/v1/completions"):
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    req = urllib.request.Request(url + path, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read()), r.headers
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read()), e.headers


def client(url):
    return openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=60)


def test_openai_client_plain_and_streamed(server):
    url, model, _ = server
    kw = dict(max_new_tokens=20, threshold=0.3, temperature=0.8, top_p=0.9, seed=5)
    alone = generate(model, "to be or", **kw)
    c = client(url)
    out = c.completions.create(model="tiny", prompt="to be or", max_tokens=20, temperature=0.8, top_p=0.9, seed=5,
                               extra_body={"threshold": 0.3})
    assert out.choices[0].text == alone.texts[0]
    assert out.choices[0].finish_reason == {"eos": "stop", "stop": "stop", "length": "length"}[alone.finish_reason[0]]
    assert out.usage.prompt_tokens == 9 and out.usage.completion_tokens == len(alone.tokens[0])
    extra = out.model_extra["setdlm"]
    assert extra["nfe"] == alone.row_nfe[0] and extra["seed"] == 5
    assert extra["tokens_per_step"] == pytest.approx(alone.tokens_per_step, abs=1e-4)

    chunks = list(c.completions.create(model="tiny", prompt="to be or", max_tokens=20, temperature=0.8, top_p=0.9,
                                       seed=5, stream=True, extra_body={"threshold": 0.3}))
    assert "".join(ch.choices[0].text for ch in chunks) == alone.texts[0]
    steps = [ch.model_extra["setdlm"] for ch in chunks]
    assert [s["step"] for s in steps] == list(range(alone.row_nfe[0]))  # one event per step
    trace = generate(model, "to be or", trace=True, **kw).trace[0]
    for s, t in zip(steps, trace):  # each event is the set committed at that step, at its positions
        assert [p + 9 for p in s["positions"]] == t.committed_positions
        assert s["token_ids"] == t.committed_tokens
        assert s["tokens"] == [model.tokenizer.decode([i]) for i in t.committed_tokens]
    assert sum(len(s["positions"]) for s in steps) == alone.row_committed[0]
    assert chunks[-1].choices[0].finish_reason is not None and chunks[-1].usage.completion_tokens == out.usage.completion_tokens


def test_chat_uses_the_template(server):
    url, model, _ = server
    msgs = [{"role": "user", "content": "hi there"}]
    out = client(url).chat.completions.create(model="tiny", messages=msgs, max_tokens=12)
    ids = chat_prompt(model.tokenizer, msgs)  # the library's chat path: the rendered template, no BOS added
    assert ids == model.tokenizer.encode("user: hi there assistant:")
    assert out.choices[0].message.content == generate(model, ids, max_new_tokens=12).texts[0]
    text = "".join(ch.choices[0].delta.content or "" for ch in client(url).chat.completions.create(
        model="tiny", messages=msgs, max_tokens=12, stream=True))
    assert text == out.choices[0].message.content


def test_concurrent_requests_each_get_their_own_result(server):
    """Different lengths and settings at once (more than max_batch, so some wait and join later)."""
    url, model, app = server
    reqs = [dict(prompt=p, max_tokens=n, **extra) for p, n, extra in [
        ("to be", 16, {"threshold": 0.3}), ("a", 30, {"threshold": 0.3}), ("hello", 8, {}),
        ("the cat", 20, {"temperature": 0.9, "seed": 1}), ("to be", 16, {"threshold": 0.3}),
        ("xyz", 12, {"temperature": 0.7, "top_p": 0.8, "seed": 2, "threshold": 0.5}), ("q", 25, {"window": 1}),
        ("the cat", 20, {"temperature": 0.9, "seed": 1, "stop": ["5"]})]]
    results = [None] * len(reqs)

    def go(i):
        results[i] = post(url, reqs[i])

    threads = [threading.Thread(target=go, args=(i,)) for i in range(len(reqs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    for r, (status, body, _) in zip(reqs, results):
        assert status == 200, body
        kw = {k: v for k, v in r.items() if k not in ("prompt", "max_tokens")}
        assert body["choices"][0]["text"] == generate(model, r["prompt"], max_new_tokens=r["max_tokens"], **kw).texts[0]
    stats = app.state.batcher.stats()
    assert 2 <= stats["peak"] <= 4  # rows did share the batch, never more than max_batch


@pytest.mark.parametrize("body, status, param, words", [
    (b"{not json", 400, None, "malformed JSON"),
    (b"[1, 2]", 400, None, "JSON object"),
    ({"prompt": 5}, 400, "prompt", "string or a list"),
    ({"prompt": ""}, 400, "prompt", "empty"),
    ({"prompt": "hi", "model": "other"}, 404, "model", "not found"),
    ({"prompt": "a" * 60}, 400, "prompt", "leaves no room for a new token in the context length L=48"),
    ({"prompt": "hi", "max_tokens": 0}, 400, "max_tokens", "positive integer"),
    ({"prompt": "hi", "max_tokens": 10**9}, 400, "max_tokens", "at most 45 new tokens"),
    ({"prompt": "hi", "max_tokens": "5"}, 400, "max_tokens", "positive integer"),
    ({"prompt": "hi", "threshold": 1.5}, 400, "threshold", "(0, 1]"),
    ({"prompt": "hi", "threshold": "high"}, 400, "threshold", "number"),
    ({"prompt": "hi", "window": 0}, 400, "window", "[1, 48]"),
    ({"prompt": "hi", "window": 10**30}, 400, "window", "[1, 48]"),  # these three once failed every row with a 500
    ({"prompt": "hi", "block_size": 10**30}, 400, "block_size", "[1, 48]"),
    ({"prompt": "hi", "seed": 2**64, "temperature": 0.5}, 400, "seed", "[-2**63, 2**64 - 1]"),
    ({"prompt": "hi", "seed": True}, 400, "seed", "integer"),
    ({"prompt": "hi", "top_k": 10**30}, 400, "top_k", "integer in"),
    ({"prompt": "hi", "temperature": -1}, 400, "temperature", "[0, 2]"),
    ({"prompt": "hi", "stream": "yes"}, 400, "stream", "bool"),
    ({"prompt": "hi", "stop": [""]}, 400, "stop", "non-empty"),
    ({"prompt": "hi", "n": 2}, 400, "n", "identical choices"),
    ({"prompt": "hi", "cache_order": "random"}, 400, "cache_order", "position"),
    ({"prompt": "hi", "speculate": True, "verify_layout": "wide"}, 400, "verify_layout", "auto, all, last"),
    ({"prompt": "hi", "speculate": False, "verify_layout": "all"}, 400, "verify_layout", "speculate=true only"),
    ({"prompt": "HI"}, 400, "prompt", "cannot be encoded"),
    ({"prompt": [1, 2, 999]}, 400, "prompt", "vocabulary"),
    ({"prompt": ["a", ""]}, 400, "prompt", "prompt[1] must not be empty"),
])
def test_bad_requests_get_a_clear_4xx_and_the_server_keeps_serving(server, body, status, param, words):
    url, model, _ = server
    got, err, _ = post(url, body)
    assert got == status
    assert err["error"]["param"] == param and words in err["error"]["message"]
    assert err["error"]["type"]
    ok, out, _ = post(url, {"prompt": "to be", "max_tokens": 4})
    assert ok == 200 and out["choices"][0]["text"] == generate(model, "to be", max_new_tokens=4).texts[0]


def test_chat_without_template_and_other_routes():
    model = _model()
    model.tokenizer.chat_template = None
    with running(model, "plain") as (url, _):
        status, err, _ = post(url, {"messages": [{"role": "user", "content": "hi"}]}, "/v1/chat/completions")
        assert status == 400 and "no chat template" in err["error"]["message"] and err["error"]["param"] == "messages"
        status, err, _ = post(url, {"messages": []}, "/v1/chat/completions")
        assert status == 400 and err["error"]["param"] == "messages"
        models = json.loads(urllib.request.urlopen(url + "/v1/models").read())
        assert [m["id"] for m in models["data"]] == ["plain"]
        health = json.loads(urllib.request.urlopen(url + "/health").read())
        assert health["status"] == "ok" and health["running"] == 0
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(url + "/v2/nothing")
        assert e.value.code == 404 and "error" in json.loads(e.value.read())


@pytest.mark.parametrize("max_queue", [0, 1])
def test_full_queue_answers_429_with_retry_after(max_queue):
    """One row (held by the gate) fills max_batch=1, ``max_queue`` more wait, the next gets 429; with
    --max-queue 0 nothing waits, a request is taken only when a row is free (the first one is)."""
    model, gate = gated(_model())
    body = {"prompt": "hi", "max_tokens": 4}
    with running(model, "q", max_batch=1, max_queue=max_queue) as (url, app):
        taken = []
        threads = [threading.Thread(target=lambda: taken.append(post(url, body))) for _ in range(1 + max_queue)]
        try:
            for i, t in enumerate(threads):
                t.start()
                if i == 0:
                    gate.wait_held(0)  # the first request holds the only row
                else:
                    assert app.state.batcher.wait(lambda stats: stats["waiting"] == i, 60)
            status, err, headers = post(url, body)
        finally:
            gate.open()
        for t in threads:
            t.join(timeout=60)
    assert status == 429 and headers["Retry-After"] == "1" and err["error"]["type"] == "rate_limit_error"
    assert [s for s, _, _ in taken] == [200] * (1 + max_queue)


def test_a_request_past_its_timeout_gets_504():
    with running(_model(), "t", timeout=1e-6) as (url, _):
        status, err, _ = post(url, {"prompt": "hi", "max_tokens": 40})
    assert status == 504 and "timed out" in err["error"]["message"]


@pytest.mark.parametrize("stream, forwards, events", [(False, 2, 0), (True, 1, 0), (True, 2, 1)])
def test_a_client_that_disconnects_frees_its_row(stream, forwards, events):
    """The backbone is gated: the row runs ``forwards`` forwards (prefill included), the client reads
    ``events`` streamed events and goes away while the next forward is held; the server notices (the ASGI
    disconnect message), and the row leaves right after that forward, whatever the machine's speed."""
    model, gate = gated(_model())
    with running(model, "g") as (url, app):
        batcher = app.state.batcher
        host, port = url.removeprefix("http://").split(":")
        try:
            conn = http.client.HTTPConnection(host, int(port), timeout=30)
            conn.request("POST", "/v1/completions", json.dumps({"prompt": "to be", "max_tokens": 40, "stream": stream,
                                                               "ignore_eos": True}),
                         {"Content-Type": "application/json"})
            gate.allow(forwards)
            gate.wait_held(forwards)
            if stream:
                resp = conn.getresponse()
                got = 0
                while got < events:
                    if resp.readline().startswith(b"data: {"):
                        got += 1
            conn.close()  # go away mid-decode
            assert batcher.wait(lambda stats: stats["cancelled"] == 1, 60)  # the timeouts only guard against a hang
        finally:
            gate.open()
        assert batcher.wait(lambda stats: stats["running"] == 0, 60)
        assert len(batcher.session) == 0
        assert gate.calls == forwards + 1  # the held forward, then the row left: not 40 steps
        ok, out, _ = post(url, {"prompt": "to be", "max_tokens": 4})  # and the server goes on serving
        assert ok == 200 and out["choices"][0]["text"] == generate(model, "to be", max_new_tokens=4).texts[0]


@pytest.mark.parametrize("where", ["prefill", "step"])
def test_a_request_whose_decode_fails_fails_alone(where):
    """One good request holds the (gated) decoding loop; a second good one and a poisoned one then join it
    with the same settings. ``prefill``: the backbone fails on any input holding "x", which the poisoned
    prompt holds, so the joint prefill of the two fails (retried row by row). ``step``: it fails on inputs
    holding a token at a position that only the poisoned request's decode commits, so the shared step of
    all three fails once it did. Either way only the poisoned request gets the error (a 500 naming it);
    both good ones get their text alone."""
    plain = _model()
    kw = dict(max_new_tokens=10, threshold=0.3)
    if where == "prefill":
        prompts, x = ["to be", "not", "or x"], plain.tokenizer.encode("x")[0]
        model, gate = gated(failing(plain, lambda call, ids, pos: bool((ids == x).any())))
    else:
        prompts = ["to be", "not", "the cat"]
        at, tok = committed_only_by(plain, [(p, kw) for p in prompts], 2)
        model, gate = gated(failing(plain, lambda call, ids, pos: bool(((ids == tok) & (pos == at)).any())))
    results = [None] * 3
    with running(model, "f", max_batch=4) as (url, app):
        threads = [threading.Thread(target=lambda i=i: results.__setitem__(i, post(url, {
            "prompt": prompts[i], "max_tokens": 10, "threshold": 0.3}))) for i in range(3)]
        try:
            threads[0].start()
            gate.wait_held(0)  # the first request's prefill waits at the gate
            for t in threads[1:]:
                t.start()
            assert app.state.batcher.wait(lambda stats: stats["waiting"] == 2, 60)
        finally:
            gate.open()
        for t in threads:
            t.join(timeout=60)
        assert app.state.batcher.stats()["peak"] == 3  # the three were in the batch together
    for i in (0, 1):
        status, body, _ = results[i]
        assert status == 200 and body["choices"][0]["text"] == generate(plain, prompts[i], **kw).texts[0]
    status, body, _ = results[2]
    assert status == 500 and "decoding failed: RuntimeError" in body["error"]["message"]


@pytest.mark.parametrize("release", [True, False])
def test_shutdown_drains_requests_in_flight_within_the_grace_period(release):
    """SIGTERM's shutdown (``should_exit``) while a request decodes (held by the gate): no new connection
    is taken; released, the request is answered in full; never released, it is cut after the grace period
    with a 503 and the server exits all the same."""
    model, gate = gated(_model())
    result = []
    with running(model, "d", grace=60 if release else 0.5) as (url, app):
        t = threading.Thread(target=lambda: result.append(post(url, {"prompt": "to be", "max_tokens": 6})))
        try:
            t.start()
            gate.wait_held(0)
            app.state.server.should_exit = True
            assert app.state.server.closed.wait(60)  # shutting down: no new connections from now on
            with pytest.raises(OSError):
                urllib.request.urlopen(url + "/health", timeout=5)
            if release:
                gate.open()
            t.join(timeout=60)
        finally:
            gate.open()
    status, body, _ = result[0]
    if release:
        assert status == 200 and body["choices"][0]["text"] == generate(model, "to be", max_new_tokens=6).texts[0]
    else:
        assert status == 503 and "shut down" in body["error"]["message"]
