"""Structured outputs on the OpenAI-compatible server (docs/decoding.md "Constrained decoding"): the official
client's ``chat.completions.parse`` with a Pydantic model, ``response_format`` json_schema / json_object and
the ``regex`` / ``choice`` extra fields on both endpoints give outputs that match, and are the tokens
``generate`` gives with the same constraint alone; bad schemas and unsatisfiable constraints are a 400."""

import json
import re
from typing import Literal

import pytest

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
pytest.importorskip("outlines_core")
openai = pytest.importorskip("openai")
pydantic = pytest.importorskip("pydantic")

from setdlm.data.tokenizers import char_tokenizer  # noqa: E402
from setdlm.chat import chat_prompt  # noqa: E402
from setdlm.decoding import generate  # noqa: E402
from setdlm.decoding.constraint import json_schema, regex  # noqa: E402

from support import running, tiny  # noqa: E402

TEMPLATE = "{% for m in messages %}{{ m.role }}: {{ m.content }} {% endfor %}assistant:"


class Verdict(pydantic.BaseModel):
    label: Literal["cat", "dog", "bird"]
    sure: bool


@pytest.fixture(scope="module")
def server():
    tok = char_tokenizer(["abcdefghijklmnopqrstuvwxyz0123456789 {}[]\":,.-_"])
    tok.chat_template = TEMPLATE
    model = tiny("setdlm", tok, L=128, seed=7)
    with running(model, "tiny", max_batch=4) as (url, _):
        yield url, model


def client(url):
    return openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=60)


def test_the_openai_client_parses_a_pydantic_model(server):
    url, model = server
    c = client(url)
    done = c.chat.completions.parse(model="tiny", messages=[{"role": "user", "content": "what is it"}],
                                    response_format=Verdict, max_tokens=60, extra_body={"threshold": 0.3})
    msg = done.choices[0].message
    assert isinstance(msg.parsed, Verdict) and done.choices[0].finish_reason == "stop"
    schema = openai.lib._pydantic.to_strict_json_schema(Verdict)  # what the client sent
    prompt = chat_prompt(model.tokenizer, [{"role": "user", "content": "what is it"}])  # the server's chat path
    alone = generate(model, [prompt], max_new_tokens=60, threshold=0.3, constraint=json_schema(schema))
    assert msg.content == alone.texts[0]


def test_response_format_regex_and_choice_on_both_endpoints(server):
    url, _ = server
    c = client(url)
    text = c.completions.create(model="tiny", prompt="zz", max_tokens=40,
                                extra_body={"response_format": {"type": "json_object"}}).choices[0].text
    assert isinstance(json.loads(text), dict)
    text = c.completions.create(model="tiny", prompt="zz", max_tokens=12, extra_body={"regex": "[a-c]+-[0-9]{2}"}
                                ).choices[0].text
    assert re.fullmatch("[a-c]+-[0-9]{2}", text)
    out = c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "pick"}], max_tokens=8,
                                    extra_body={"choice": ["red", "green", "blue"]})
    assert out.choices[0].message.content in ("red", "green", "blue")
    out = c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "pick"}], max_tokens=8,
                                    stream=True, extra_body={"regex": "(yes|no)"})
    assert "".join(ch.choices[0].delta.content or "" for ch in out if ch.choices) in ("yes", "no")


def test_bad_structured_requests_are_a_400_naming_the_problem(server):
    url, _ = server
    c = client(url)
    bad = [({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "bogus"}}}},
            "invalid schema at type", "response_format"),
           ({"response_format": {"type": "xml"}}, "must be 'text', 'json_object' or 'json_schema'", "response_format"),
           ({"response_format": {"type": "json_schema"}}, "holding the JSON Schema under 'schema'", "response_format"),
           ({"choice": ["a", 3]}, "every choice must be a non-empty string", "choice"),
           ({"regex": "a", "choice": ["b"]}, "give one of response_format, regex, choice", "choice"),
           ({"regex": "a{50}"}, "no match of at most 5 tokens", None),
           ({"regex": "(a"}, "invalid regular expression", "regex")]
    for extra, needle, param in bad:
        with pytest.raises(openai.BadRequestError) as e:
            c.completions.create(model="tiny", prompt="zz", max_tokens=5, extra_body=extra)
        assert needle in e.value.body["message"] and e.value.body["param"] == param, (extra, e.value.body)
    assert c.completions.create(model="tiny", prompt="zz", max_tokens=3).choices[0].text is not None  # still serving
