"""The server's ``response_format`` uses the engines ``generate`` uses (docs/decoding.md "Two engines"): a JSON Schema
only llguidance compiles is enforced on an AR model's requests (the tokens ``generate`` gives alone), and a 400
naming setdlm's reason and ``response_format`` on a SetDLM's set decode."""

import json

import pytest

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
pytest.importorskip("outlines_core")
pytest.importorskip("llguidance")
openai = pytest.importorskip("openai")
jsonschema = pytest.importorskip("jsonschema")

from setdlm.data.tokenizers import char_tokenizer  # noqa: E402
from setdlm.decoding import generate  # noqa: E402

from support import running, tiny  # noqa: E402

TOK = char_tokenizer(["abc0123456789xyz{}[]\":, -"])
SCHEMA = {"type": "object", "properties": {"x": {"type": "string", "pattern": "^[a-c]+(-[a-c]+)*$", "maxLength": 5}},
          "required": ["x"], "additionalProperties": False}  # setdlm's automaton refuses maxLength beside this pattern
FORMAT = {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMA}}}


def client(url):
    return openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=60)


def test_an_ar_model_serves_it_with_llguidance():
    model = tiny("ar", TOK, L=64, seed=3)
    with running(model, "tiny", max_batch=4) as (url, _):
        out = client(url).completions.create(model="tiny", prompt="ab", max_tokens=30, n=2, temperature=1.0, seed=5,
                                             extra_body=FORMAT)
    texts = [ch.text for ch in out.choices]
    for text in texts:
        jsonschema.validate(json.loads(text), SCHEMA)
    assert texts[0] == generate(model, ["ab"], max_new_tokens=30, constraint=SCHEMA, temperature=1.0, seed=5).texts[0]


def test_a_set_decode_is_a_400_naming_the_reason():
    with running(tiny("setdlm", TOK, L=64, seed=3), "tiny", max_batch=4) as (url, _):
        with pytest.raises(openai.BadRequestError) as e:
            client(url).completions.create(model="tiny", prompt="ab", max_tokens=30, extra_body=FORMAT)
    message = e.value.body["message"]
    assert "'maxLength' at (root)/properties/x" in message and "only left-to-right decodes" in message
    assert e.value.body["param"] == "response_format"


def test_answers_close_within_max_tokens():
    """llguidance's rows close within max_tokens (docs/decoding.md "Two engines"): a row whose model opens a value
    longer than the tokens left (before: cut, "length") writes its closing instead, "stop" with a valid document."""
    inner = {"type": "object", "properties": {k: SCHEMA["properties"]["x"] for k in ("aaaa", "bbbb", "cccc")},
             "required": ["aaaa", "bbbb", "cccc"], "additionalProperties": False}
    grows = {"type": "object", "properties": {"x": inner, "y": {"type": "integer"}}, "additionalProperties": False}
    model = tiny("ar", TOK, L=64, seed=3)
    alone = generate(model, ["b"], max_new_tokens=40, constraint=grows, temperature=1.0, seed=1)
    assert alone.finish_reason == ["eos"]
    with running(model, "tiny", max_batch=4) as (url, _):
        out = client(url).completions.create(
            model="tiny", prompt="b", max_tokens=40, temperature=1.0, seed=1,
            extra_body={"response_format": {"type": "json_schema", "json_schema": {"name": "g", "schema": grows}}})
        tight = client(url).completions.create(model="tiny", prompt="ab", max_tokens=20, extra_body=FORMAT)
    assert out.choices[0].text == alone.texts[0] and out.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(out.choices[0].text), grows)
    assert tight.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(tight.choices[0].text), SCHEMA)
