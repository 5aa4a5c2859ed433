"""The server against careless and hostile clients, on loopback: malformed bodies are 400s naming the
problem (never a 500), a body past the limit is 413, a POST that is not JSON is 415, a foreign Host header
is 403, tokenizing one prompt does not block the others, a client that sends half a body and leaves is one
log line, and `setdlm serve` refuses an unusable port before loading the model and exits on SIGTERM even
when a client stalls."""

import http.client
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading

import pytest

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")

from setdlm.decoding import generate  # noqa: E402

from support import CharTokenizer, Output, free_port, run, running, save_tiny, tiny_model  # noqa: E402


class HeldTokenizer(CharTokenizer):
    """The test tokenizer, whose ``encode`` of a text starting with "hold" waits until the test releases
    it: a slow tokenization the test controls."""

    def __init__(self):
        self.entered, self.release = threading.Event(), threading.Event()

    def encode(self, text):
        if text.startswith("hold"):
            self.entered.set()
            assert self.release.wait(60)
        return super().encode(text)


def _model():
    m = tiny_model("setdlm", L=48, seed=2)
    m.tokenizer = HeldTokenizer()
    return m


@pytest.fixture(scope="module")
def server():
    model = _model()
    with running(model, "h") as (url, app):
        yield url, model, app


def raw_post(url, body: bytes, headers=None, path="/v1/completions"):
    """(status, JSON body) of a POST with exactly these bytes and headers."""
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    conn.request("POST", path, body, {"Content-Type": "application/json", **(headers or {})})
    r = conn.getresponse()
    out = r.status, json.loads(r.read() or b"null")
    conn.close()
    return out


def get(url, path="/health", host=None):
    h, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(h, int(port), timeout=60)
    conn.putrequest("GET", path, skip_host=host is not None)
    if host is not None:
        conn.putheader("Host", host)
    conn.endheaders()
    r = conn.getresponse()
    out = r.status, json.loads(r.read())
    conn.close()
    return out


@pytest.mark.parametrize("body, param, words", [
    (b'{"prompt": "hi\xff"}', None, "not valid UTF-8"),
    (b'{"prompt": "hi\\ud800"}', "prompt", "lone surrogate (\\ud800)"),
    (b'{"prompt": "hi", "stop": ["\\udfff"]}', "stop", "lone surrogate"),
    (b'{"prompt": "hi", "max_tokens": ' + b"9" * 5000 + b"}", None, "malformed JSON body: Exceeds the limit"),
    (b'{"prompt": "hi", "x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", None, "nested too deeply"),
    (b'{"prompt": "hi", "user": ' + b"[" * 40 + b"]" * 40 + b"}", "user", "nested too deeply"),
    (b'{"prompt": "hi", "response_format": {"type": "yaml"}}', "response_format", "type must be"),
    (b'{"prompt": "hi", "suffix": "end", "stop": "x"}', "stop", "does not apply with a suffix"),
    (b'{"prompt": "hi", "suffix": 5}', "suffix", "must be a string"),
    (b'{"prompt": "hi", "suffix": "' + b"a" * 46 + b'"}', "prompt", "prompt + suffix is 49 tokens long"),
    (b'{"prompt": "hi", "echo": "yes"}', "echo", "bool"),
    (b'{"prompt": "hi", "seed": ' + str(2**64).encode() + b', "temperature": 0.5}', "seed", "2**64 - 1"),
])
def test_malformed_bodies_are_400s_naming_the_problem(server, body, param, words):
    url, model, _ = server
    status, err = raw_post(url, body)
    assert status == 400, err
    assert err["error"]["param"] == param and words in err["error"]["message"], err
    assert len(err["error"]["message"]) < 300  # one line, the offending value not echoed whole
    status, out = raw_post(url, b'{"prompt": "to be", "max_tokens": 4}')
    assert status == 200 and out["choices"][0]["text"] == generate(model, "to be", max_new_tokens=4).texts[0]


def test_tiny_temperature_is_greedy_and_echo_is_honoured(server):
    url, model, _ = server
    greedy = generate(model, "to be", max_new_tokens=8).texts[0]
    status, out = raw_post(url, json.dumps({"prompt": "to be", "max_tokens": 8, "temperature": 1e-300,
                                            "seed": 1}).encode())
    assert status == 200 and out["choices"][0]["text"] == greedy  # not NaN logits
    status, out = raw_post(url, b'{"prompt": "to be", "max_tokens": 8, "echo": true}')
    assert status == 200 and out["choices"][0]["text"] == "to be" + greedy
    status, out = raw_post(url, b'{"prompt": "to be", "max_tokens": 8, "response_format": {"type": "text"}}')
    assert status == 200 and out["choices"][0]["text"] == greedy
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    conn.request("POST", "/v1/completions", b'{"prompt": "to be", "max_tokens": 8, "echo": true, "stream": true}',
                 {"Content-Type": "application/json"})
    raw = conn.getresponse().read().decode()
    chunks = [json.loads(x[6:]) for x in raw.split("\n\n") if x.startswith("data: {")]
    assert "".join(c["choices"][0]["text"] for c in chunks) == "to be" + greedy


def test_suffix_infills_the_middle(server):
    """A completion with a suffix is decoded as ``infill`` decodes prompt + [MASK] × max_tokens + suffix."""
    from setdlm.decoding import infill

    url, model, _ = server
    for extra in ({}, {"temperature": 0.8, "seed": 3, "threshold": 0.4}):
        want = infill(model, ["to be"], [" the end"], 8, **extra).texts[0]
        body = json.dumps({"prompt": "to be", "suffix": " the end", "max_tokens": 8, **extra}).encode()
        status, out = raw_post(url, body)
        assert status == 200 and out["choices"][0]["text"] == want and out["choices"][0]["finish_reason"] == "stop"
        assert out["usage"]["completion_tokens"] == 8 and out["usage"]["prompt_tokens"] == 6 + 8  # BOS + prompt, suffix
        host, port = url.removeprefix("http://").split(":")
        conn = http.client.HTTPConnection(host, int(port), timeout=60)
        conn.request("POST", "/v1/completions", json.dumps({**json.loads(body), "stream": True}),
                     {"Content-Type": "application/json"})
        raw = conn.getresponse().read().decode()
        chunks = [json.loads(x[6:]) for x in raw.split("\n\n") if x.startswith("data: {")]
        assert "".join(c["choices"][0]["text"] for c in chunks) == want


def test_body_limit_content_type_and_host():
    with running(tiny_model("setdlm", L=48, seed=2), "b", max_body_mb=2000 / 2**20) as (url, _):
        _limits(url)


def _limits(url):
    big = json.dumps({"prompt": "a" * 3000}).encode()
    status, err = raw_post(url, big)  # refused from its Content-Length
    assert status == 413 and "limit is 2,000" in err["error"]["message"]
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=60)  # no Content-Length: counted while read
    conn.request("POST", "/v1/completions", iter([big[:1500], big[1500:]]), {"Content-Type": "application/json"},
                 encode_chunked=True)
    r = conn.getresponse()
    assert r.status == 413 and "exceeds the limit" in json.loads(r.read())["error"]["message"]
    conn.close()
    for kind in ("text/plain", "application/x-www-form-urlencoded", ""):  # what a web page may post freely
        status, err = raw_post(url, b'{"prompt": "hi"}', {"Content-Type": kind})
        assert status == 415 and err["error"]["param"] == "Content-Type"
    assert get(url, host="evil.example:8000")[0] == 403  # DNS rebinding: a foreign name for 127.0.0.1
    status, err = get(url, "/v1/models", host="evil.example")
    assert status == 403 and err["error"]["code"] == "host_not_allowed" and "evil.example" in err["error"]["message"]
    assert get(url, host=f"localhost:{port}")[0] == 200 and get(url, host=f"[::1]:{port}")[0] == 200


def test_any_host_when_bound_beyond_loopback():
    with running(tiny_model("setdlm", L=48, seed=2), "any", host="0.0.0.0") as (url, _):  # (the test binds loopback)
        assert get(url, host="my-server.lan:8000")[0] == 200


def test_tokenizing_a_prompt_does_not_block_other_clients(server):
    """The held prompt's tokenization waits inside the server; /health and another request still answer."""
    url, model, _ = server
    tok = model.tokenizer
    result = []
    t = threading.Thread(target=lambda: result.append(raw_post(url, b'{"prompt": "hold on", "max_tokens": 4}')))
    t.start()
    try:
        assert tok.entered.wait(60)
        assert get(url)[0] == 200
        status, out = raw_post(url, b'{"prompt": "to be", "max_tokens": 4}')
        assert status == 200 and out["choices"][0]["text"] == generate(model, "to be", max_new_tokens=4).texts[0]
        assert not result  # still held
    finally:
        tok.release.set()
        t.join(60)
    assert result[0][0] == 200


class _Heard(logging.Handler):
    """Sets ``heard`` when the logger writes a line holding ``words``."""

    def __init__(self, words: str):
        super().__init__()
        self.words, self.heard = words, threading.Event()

    def emit(self, record):
        if self.words in record.getMessage():
            self.heard.set()


def test_half_a_body_then_gone_is_one_log_line(server, caplog):
    url, model, _ = server
    host, port = url.removeprefix("http://").split(":")
    logger, heard = logging.getLogger("setdlm.serve"), _Heard("went away")
    logger.addHandler(heard)
    try:
        with caplog.at_level(logging.WARNING, logger="setdlm.serve"):
            with socket.create_connection((host, int(port))) as s:
                s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                          b"Content-Length: 1000\r\n\r\n" + b'{"prompt": "')
            assert heard.heard.wait(60)  # the server logged it (the timeout only guards against a hang)
    finally:
        logger.removeHandler(heard)
    (line,) = [r.getMessage() for r in caplog.records if r.name == "setdlm.serve"]
    assert "after sending 12 bytes of its body" in line and "\n" not in line
    assert raw_post(url, b'{"prompt": "to be", "max_tokens": 4}')[0] == 200


def test_serve_refuses_an_unusable_port_or_host_before_loading(capsys):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        code, _, err = run(["serve", "./no-such-model", "--port", str(port)], capsys)  # the model is never read
    assert code == 2 and err.strip().startswith(f"setdlm serve: error: cannot listen on 127.0.0.1:{port}: ")
    assert len(err.strip().splitlines()) == 1
    code, _, err = run(["serve", "./no-such-model", "--host", "256.1.1.1"], capsys)
    assert code == 2 and "host '256.1.1.1': not an address of this machine" in err
    code, _, err = run(["serve", "./no-such-model", "--port", "70000"], capsys)
    assert code == 2 and "port must be an integer in [0, 65535]" in err
    code, _, err = run(["serve", "./no-such-model", "--max-body-mb", "0"], capsys)
    assert code == 2 and err.strip() == "setdlm serve: error: --max-body-mb must be > 0 (MiB), got 0.0"


def test_bound_to_all_interfaces_warns(caplog, capsys):
    """The warning comes before the model loads (here it does not exist, so nothing ever listens)."""
    with caplog.at_level(logging.WARNING, logger="setdlm.serve"):
        code, _, err = run(["serve", "./no-such-model", "--host", "0.0.0.0", "--port", str(free_port())], capsys)
    assert code == 2 and "does not exist" in err
    assert any("listening on 0.0.0.0" in r.getMessage() and "no authentication" in r.getMessage()
               for r in caplog.records)


def test_sigterm_drains_and_exits_even_when_a_client_stalls(tmp_path):
    """A client that sent half a body and stalls does not keep the server alive past --grace: SIGTERM, and
    it exits cleanly (status 0, no traceback)."""
    model = save_tiny(tmp_path / "m")
    port = free_port()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.abspath("src"), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.Popen([sys.executable, "-m", "setdlm", "serve", model, "--port", str(port), "--grace", "2"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    out = Output(proc.stdout)
    try:
        url = f"http://127.0.0.1:{port}"
        assert out.ready.wait(300) and not out.ended.is_set(), out.text()[-2000:]  # it listens (a loaded machine: minutes)
        stall = socket.create_connection(("127.0.0.1", port))
        stall.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                      b"Content-Length: 100\r\n\r\n{")
        assert raw_post(url, b'{"prompt": "ab", "max_tokens": 8}')[0] == 200  # the stalled request is in flight
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=60)
        stall.close()
        assert out.ended.wait(60)
        log = out.text()
        assert code in (0, -signal.SIGTERM), log[-2000:]  # uvicorn re-raises the signal once it has shut down
        assert "Traceback" not in log and "ASGI callable" not in log, log[-2000:]
        assert "POST /v1/completions: cut off, the server shut down before it finished" in log
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
