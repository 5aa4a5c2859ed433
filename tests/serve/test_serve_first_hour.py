"""The server as a new user meets it (docs/serve.md): the page sends only the settings the served family
takes, a 400 names the field at fault, a constrained answer that fills its budget is "stop", logprobs are
answered or refused, never silently null, the start is logged with the page's URL, and a shutdown that cuts a
stream ends it with an error event. Each test fails on the code before it."""

import http.client
import json
import os
import subprocess
import sys
import threading
from urllib.parse import urlsplit

import pytest

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")

import setdlm  # noqa: E402

from support import CharTokenizer, Output, free_port, gated, running, subprocess_env, tiny_model  # noqa: E402


def post(url: str, body: dict, path: str = "/v1/completions") -> tuple[int, dict]:
    u = urlsplit(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=120)
    try:
        conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
        r = conn.getresponse()
        return r.status, json.loads(r.read())
    finally:
        conn.close()


def get(url: str, path: str) -> dict:
    u = urlsplit(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=60)
    try:
        conn.request("GET", path)
        return json.loads(conn.getresponse().read())
    finally:
        conn.close()


@pytest.fixture(scope="module")
def ar():
    return setdlm.load("shakespeare-ar")


def test_models_lists_the_settings_the_family_takes_and_400s_name_the_field(ar):
    setdlm_model = setdlm.load("shakespeare-setdlm-smax8")
    with running(ar, "ar") as (url, _):
        assert get(url, "/v1/models")["data"][0]["settings"] == []
        status, body = post(url, {"prompt": "ROMEO:", "max_tokens": 4, "threshold": 0.7})
        assert status == 400 and body["error"]["param"] == "threshold", body  # was null
        assert "threshold applies to" in body["error"]["message"]
        status, body = post(url, {"prompt": "ROMEO:", "max_tokens": 4, "speculate": True})
        assert status == 400 and body["error"]["param"] == "speculate", body
    with running(setdlm_model, "s") as (url, _):
        assert get(url, "/v1/models")["data"][0]["settings"] == ["window", "threshold", "speculate", "cache_order",
                                                                    "verify_layout"]


def test_the_page_sends_only_the_family_settings():
    """The page's script drops each family-specific setting the served model does not list (a browser run of
    it on an AR model is in test_serve_page.py)."""
    from importlib import resources

    page = resources.files("setdlm.serve").joinpath("static/index.html").read_text()
    assert 'FAMILY_SETTINGS = ["threshold", "window", "cache_order", "speculate"]' in page
    assert "for (const k of FAMILY_SETTINGS) if (!takes.has(k)) delete req[k];" in page
    assert 'if (!run.done) throw new Error("the stream ended before [DONE]' in page


def test_a_constrained_answer_that_fills_its_budget_is_stop():
    """The constraint closed the answer exactly at max_tokens: a whole match, "stop" (the openai client's
    parse() raises LengthFinishReasonError on "length")."""
    question = "Tom has 3 apples. He buys 6 more. He gives away 4. How many apples does Tom have now?"
    with running(setdlm.load("arith-ar"), "arith-ar") as (url, _):
        status, body = post(url, {"prompt": question, "max_tokens": 6, "choice": ["#### 5", "#### 7"]})
        assert status == 200, body
        assert body["choices"][0]["text"] in ("#### 5", "#### 7") and body["choices"][0]["finish_reason"] == "stop"
        status, body = post(url, {"prompt": question, "max_tokens": 6})  # unconstrained: the budget cut it
        assert status == 200 and body["choices"][0]["finish_reason"] == "length", body


def test_logprobs_are_answered_or_refused_never_silently_null(ar):
    with running(ar, "ar") as (url, _):
        for body, param in (({"logprobs": 21}, "logprobs"), ({"top_logprobs": 3}, "top_logprobs"),
                            ({"logprobs": True}, "logprobs")):
            status, got = post(url, {"prompt": "ROMEO:", "max_tokens": 4, **body})
            assert status == 400 and got["error"]["param"] == param, got
        status, got = post(url, {"prompt": "ROMEO:", "max_tokens": 4, "logprobs": None, "n": 1})
        assert status == 200 and got["choices"][0]["logprobs"] is None, got
        status, got = post(url, {"prompt": "ROMEO:", "max_tokens": 4, "logprobs": 2})
        assert status == 200 and 1 <= len(got["choices"][0]["logprobs"]["token_logprobs"]) <= 4, got


def test_the_start_is_logged_with_the_model_and_the_page_url():
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "setdlm", "serve", "arith-ar", "--port", str(port)],
                            env=subprocess_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    out = Output(proc.stdout, mark="serving arith-ar")
    try:
        assert out.ready.wait(300) and not out.ended.is_set(), out.text()[-2000:]  # a loaded machine: minutes
        assert f"serving arith-ar (ar, context 192): the decode-order page at http://127.0.0.1:{port}/, the API " \
               "at /v1" in out.text()
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def test_a_shutdown_that_cuts_a_stream_sends_an_error_event():
    """SIGTERM (the server's should_exit) while a stream is mid-decode and cannot finish within --grace: the
    stream's last event is an error saying so (then [DONE], as after any error), so a client can tell it from a
    finished answer.
    The backbone is gated: the decode is held at its third forward whatever the machine's speed."""
    model = tiny_model("setdlm", L=48, seed=2)
    model.tokenizer = CharTokenizer()
    model, gate = gated(model)
    events: list[str] = []
    first = threading.Event()
    with running(model, "tiny", grace=1.0) as (url, app):
        u = urlsplit(url)
        conn = http.client.HTTPConnection(u.hostname, u.port, timeout=120)
        conn.request("POST", "/v1/completions", json.dumps({"prompt": "ab", "max_tokens": 20, "stream": True}),
                     {"Content-Type": "application/json"})
        resp = conn.getresponse()

        def read():
            for line in resp:
                if line.startswith(b"data:"):
                    events.append(line[5:].strip().decode())
                    first.set()
            first.set()

        reader = threading.Thread(target=read)
        reader.start()
        gate.allow(3)  # the prefill and two steps; the fourth forward waits at the gate
        assert first.wait(60)
        app.state.server.should_exit = True  # what SIGTERM does
        reader.join(timeout=60)
        gate.open()  # let the held forward return, so the decoding thread can stop
        conn.close()
    data = [json.loads(e) for e in events if e != "[DONE]"]
    assert data and "shut down before this request finished" in data[-1]["error"]["message"], events
    assert all("error" not in d and d["choices"][0]["finish_reason"] is None for d in data[:-1])
