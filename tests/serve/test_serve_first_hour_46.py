"""First-hour traps of the server (issue #46 items 9, 12b, 14): the decode-order page asks for no favicon and
its default settings show parallel decoding on the default model; a regex no output can meet within the
budget is a 400 whose ``param`` is ``regex``; ``--api-key`` (vLLM's rule: a Bearer token on ``/v1/*``) and the
all-interfaces warning that offers it. Each test fails on the code before it."""

import logging
import re
from importlib import resources

import pytest

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")

import setdlm  # noqa: E402
from setdlm.formats import pretrained  # noqa: E402
from setdlm.serve import ServeOptions  # noqa: E402

from support import CharTokenizer, openai_client, post_json, running, tiny_model  # noqa: E402


def _page() -> str:
    return resources.files("setdlm.serve").joinpath("static/index.html").read_text()


def test_the_pages_defaults_show_parallel_decoding_and_it_asks_for_no_favicon():
    page = _page()
    threshold = float(re.search(r'id="threshold"[^>]*value="([0-9.]+)"', page).group(1))
    max_tokens = int(re.search(r'id="max_tokens"[^>]*value="([0-9]+)"', page).group(1))
    prompt = re.search(r'<textarea id="prompt"[^>]*>([^<]*)</textarea>', page).group(1)
    out = setdlm.load(pretrained.DEFAULT).generate(prompt, max_new_tokens=max_tokens, threshold=threshold)
    assert out.tokens_per_step > 1.5  # was 1.00 at the old default (0.7)
    assert '<link rel="icon" href="data:,">' in page  # the browser fetches no /favicon.ico
    model = tiny_model("ar", L=32)
    model.tokenizer = CharTokenizer()
    with running(model, "m") as (url, _):
        import urllib.request

        with urllib.request.urlopen(url + "/favicon.ico", timeout=30) as r:
            assert r.status == 204  # was 404 for a client that asks anyway


def test_a_regex_no_output_can_meet_names_regex():
    with running(setdlm.load("arith-ar"), "arith-ar") as (url, _):
        status, err = post_json(url, {"prompt": "1+1=", "max_tokens": 5, "regex": "a{1000}"})
        assert status == 400 and err["error"]["param"] == "regex", err  # was null
        assert "no match of at most 5 tokens" in err["error"]["message"]
        status, err = post_json(url, {"prompt": "1+1=", "max_tokens": 3, "choice": ["#### 12345"]})
        assert status == 400 and err["error"]["param"] == "choice", err


def test_api_key_guards_v1_as_vllm_does():
    model = tiny_model("ar", L=32)
    model.tokenizer = CharTokenizer()
    key = "s3cret-key-1"
    with running(model, "m", api_key=key) as (url, _):
        status, err = post_json(url, {"prompt": "to be", "max_tokens": 2})
        assert status == 401 and err["error"]["type"] == "authentication_error", err
        status, err = post_json(url, {"prompt": "to be", "max_tokens": 2}, headers={"Authorization": "Bearer wrong-key"})
        assert status == 401
        status, out = post_json(url, {"prompt": "to be", "max_tokens": 2}, headers={"Authorization": f"Bearer {key}"})
        assert status == 200, out
        assert openai_client(url, api_key=key).models.list().data[0].id == "m"  # the openai client sends it
        status, _ = post_json(url, {"prompt": "to be"}, "/tokenize")
        assert status == 200  # only /v1/* is guarded, as vLLM guards it
    with pytest.raises(ValueError, match="api_key must be a string of at least 8 characters"):
        ServeOptions(api_key="short")


def test_serving_every_interface_warns_and_offers_an_api_key(caplog, capsys):
    from support import free_port, run

    with caplog.at_level(logging.WARNING, logger="setdlm.serve"):
        code, _, err = run(["serve", "./no-such-model", "--host", "0.0.0.0", "--port", str(free_port())], capsys)
    assert code == 2 and "does not exist" in err
    warned = [r.getMessage() for r in caplog.records if "0.0.0.0" in r.getMessage()]
    assert any("every interface" in w and "--api-key" in w and "no authentication" in w for w in warned), warned
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="setdlm.serve"):
        run(["serve", "./no-such-model", "--host", "0.0.0.0", "--port", str(free_port()), "--api-key", "k" * 12],
            capsys)
    assert any("need the API key" in r.getMessage() for r in caplog.records)
