"""Structured outputs on the OpenAI-compatible server (docs/decoding.md "Constrained decoding"): the official
client's ``chat.completions.parse`` with a Pydantic model, ``response_format`` json_schema / json_object and
the ``regex`` / ``choice`` extra fields on both endpoints give outputs that match, and are the tokens
``generate`` gives with the same constraint alone; bad schemas and unsatisfiable constraints are a 400."""

import json
import re
import threading
import urllib.request
from typing import Literal, Optional, Union

import pytest

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
pytest.importorskip("outlines_core")
openai = pytest.importorskip("openai")
pydantic = pytest.importorskip("pydantic")
jsonschema = pytest.importorskip("jsonschema")

from setdlm.data.tokenizers import char_tokenizer  # noqa: E402
from setdlm.chat import chat_prompt  # noqa: E402
from setdlm.decoding import generate  # noqa: E402
from setdlm.decoding.structured import constraint as C  # noqa: E402
from setdlm.decoding.structured.constraint import json_schema, regex  # noqa: E402

from support import running, tiny  # noqa: E402

TEMPLATE = "{% for m in messages %}{{ m.role }}: {{ m.content }} {% endfor %}assistant:"


class Verdict(pydantic.BaseModel):
    label: Literal["cat", "dog", "bird"]
    sure: bool


class Pet(pydantic.BaseModel):
    kind: Literal["cat", "dog"]
    age: int = pydantic.Field(ge=0, le=30)


class Owner(pydantic.BaseModel):  # what Pydantic users write: bounds, lengths, patterns, Optional, nesting, lists
    name: str = pydantic.Field(max_length=8, pattern="^[a-z]+$")
    score: float = pydantic.Field(ge=0, le=10)
    nick: Optional[str] = pydantic.Field(default=None, max_length=4)
    pets: list[Pet] = pydantic.Field(max_length=2)
    home: Optional[Pet] = None


class Cat(pydantic.BaseModel):
    kind: Literal["cat"]
    lives: int = pydantic.Field(ge=1, le=9)


class Dog(pydantic.BaseModel):
    kind: Literal["dog"]
    good: bool


class Pick(pydantic.BaseModel):  # a discriminated union: oneOf of $refs told apart by a const property
    pet: Union[Cat, Dog] = pydantic.Field(discriminator="kind")


@pytest.fixture
def bounds():
    """Set the constraint module's bounds for a test, restored after it."""
    old = C.DEFAULT_COMPILER.bounds
    yield C.set_bounds
    C.set_bounds(**{f: getattr(old, f) for f in ("seconds", "memory", "edges", "cache_bytes", "workers")})


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


def assert_400s(c, bad, *, max_tokens: int) -> None:
    """Each ``(extra_body, needle, param)`` of ``bad`` is a 400 whose message holds ``needle`` and whose param is
    ``param``; the server still serves after them."""
    for extra, needle, param in bad:
        with pytest.raises(openai.BadRequestError) as e:
            c.completions.create(model="tiny", prompt="zz", max_tokens=max_tokens, extra_body=extra)
        assert needle in e.value.body["message"] and e.value.body["param"] == param, (extra, e.value.body)
    assert c.completions.create(model="tiny", prompt="zz", max_tokens=3).choices[0].text is not None  # still serving


def test_bad_structured_requests_are_a_400_naming_the_problem(server):
    url, _ = server
    c = client(url)
    bad = [({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "bogus"}}}},
            "invalid schema at type", "response_format"),
           ({"response_format": {"type": "xml"}}, "must be 'text', 'json_object' or 'json_schema'", "response_format"),
           ({"response_format": {"type": "json_schema"}}, "holding the JSON Schema under 'schema'", "response_format"),
           ({"choice": ["a", 3]}, "every choice must be a non-empty string", "choice"),
           ({"regex": "a", "choice": ["b"]}, "give one of response_format, regex, choice", "choice"),
           ({"regex": "a{50}"}, "no match of at most 5 tokens", "regex"),  # was null (issue #46 item 12b)
           ({"regex": "(a"}, "invalid regular expression", "regex")]
    assert_400s(c, bad, max_tokens=5)


def test_pydantic_models_with_bounds_lengths_patterns_optional_nesting_lists_and_unions(server):
    url, _ = server
    c = client(url)
    for model, seed in ((Owner, 0), (Owner, 1), (Pick, 0), (Pick, 1)):
        schema = openai.lib._pydantic.to_strict_json_schema(model)
        done = c.chat.completions.parse(model="tiny", messages=[{"role": "user", "content": "who"}], response_format=model,
                                        max_tokens=100, seed=seed, extra_body={"threshold": 0.3})
        assert isinstance(done.choices[0].message.parsed, model)
        jsonschema.validate(json.loads(done.choices[0].message.content), schema)


def test_probe_requests_are_valid_or_a_400_naming_the_field_and_the_server_lives(server, bounds):
    url, _ = server
    c = client(url)
    text = c.completions.create(model="tiny", prompt="zz", max_tokens=12, extra_body={"regex": ".{0,100000}"}).choices[0].text
    assert re.fullmatch(".{0,12}", text)  # cut to what 12 tokens hold: compiled at once
    text = c.completions.create(model="tiny", prompt="zz", max_tokens=8, extra_body={"regex": "^[ab]+$"}).choices[0].text
    assert re.fullmatch("[ab]+", text)
    text = c.completions.create(model="tiny", prompt="zz", max_tokens=7,
                                extra_body={"choice": ["yes", "yes sir"], "ignore_eos": True}).choices[0].text
    assert text == "yes sir"
    bounds(seconds=0.3, memory=300 << 20)
    bad = [({"regex": "[ab]*a[ab]{26}"}, "bound", "regex"),
           ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {
               "type": "object", "properties": {"a": {"type": "integer"}}, "minProperties": 2}}}},
            "'minProperties' at (root)", "response_format"),
           ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {
               "type": "array", "items": {"type": "string"}, "uniqueItems": True}}}}, "'uniqueItems' at (root)",
            "response_format")]
    assert_400s(c, bad, max_tokens=40)


def test_compiling_holds_its_own_pool_not_the_one_parsing_requests(bounds):
    """Eight requests whose constraint compiles until its bound, on one compiler: a plain request sent while they
    are all compiling or waiting to is answered before they are."""
    bounds(workers=1, seconds=4, memory=300 << 20)
    tok = char_tokenizer(["abcdefghijklmnopqrstuvwxyz0123456789 "])
    model = tiny("setdlm", tok, L=64, seed=2)
    with running(model, "tiny", max_batch=4) as (url, _):
        c = client(url)
        answers = []

        def slow(k):
            try:
                c.completions.create(model="tiny", prompt="ab", max_tokens=40, extra_body={"regex": f"[ab]*a[ab]{{{26 + k}}}"})
            except openai.BadRequestError as e:
                answers.append(e.body["param"])

        threads = [threading.Thread(target=slow, args=(k,)) for k in range(8)]
        for t in threads:
            t.start()
        for _ in range(2000):  # until all eight are in the compile pool (bounded: they wait there for seconds)
            health = json.loads(urllib.request.urlopen(url + "/health").read())
            if health["compiling"] == 8:
                break
        assert health["compiling"] == 8
        assert c.completions.create(model="tiny", prompt="ab", max_tokens=4).choices[0].text is not None
        pending = json.loads(urllib.request.urlopen(url + "/health").read())["compiling"]
        for t in threads:
            t.join(timeout=120)
        assert pending > 0 and answers == ["regex"] * 8
