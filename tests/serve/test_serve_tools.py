"""Tool calls by construction and the messages of a tool conversation (issue #45 point 3; docs/serve.md
"Tools"), read with the official openai client and LangChain; and the audit of the request fields: every
field the server knows is honoured or refused with a 400 naming it, an unknown one is refused too."""

import json

import pytest

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
pytest.importorskip("outlines_core")
openai = pytest.importorskip("openai")
jsonschema = pytest.importorskip("jsonschema")

from setdlm.data.tokenizers import char_tokenizer  # noqa: E402
from setdlm.serve import schemas  # noqa: E402

from support import openai_client, post_json, running, tiny  # noqa: E402

TEMPLATE = "{% for m in messages %}{{ m.role }}: {{ m.content }} {% endfor %}assistant:"
WEATHER = {"type": "function", "function": {"name": "weather", "description": "the weather in a city", "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "maxLength": 6}, "days": {"type": "integer",
                                                                                        "minimum": 1, "maximum": 7}},
    "required": ["city", "days"], "additionalProperties": False}}}
ADD = {"type": "function", "function": {"name": "add", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 99},
                                     "b": {"type": "integer", "minimum": 0, "maximum": 99}},
    "required": ["a", "b"], "additionalProperties": False}}}
ASK = [{"role": "user", "content": "weather in paris"}]


@pytest.fixture(scope="module")
def server():
    tok = char_tokenizer(["abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 {}[]\":,.-_\n"])
    tok.chat_template = TEMPLATE
    model = tiny("setdlm", tok, L=192, seed=7)
    with running(model, "tiny", max_batch=4) as (url, _):
        yield url, model


def _check_call(call, tools: list[dict]) -> dict:
    spec = {t["function"]["name"]: t["function"]["parameters"] for t in tools}
    assert call.type == "function" and call.id.startswith("call_") and call.function.name in spec
    args = json.loads(call.function.arguments)
    jsonschema.validate(args, spec[call.function.name])
    return args


def test_required_and_named_tool_choice_give_valid_calls(server):
    url, _ = server
    c = openai_client(url)
    for choice, tools in (("required", [WEATHER, ADD]), ({"type": "function", "function": {"name": "add"}}, [WEATHER, ADD])):
        out = c.chat.completions.create(model="tiny", messages=ASK, tools=tools, tool_choice=choice, max_tokens=60)
        msg = out.choices[0].message
        assert out.choices[0].finish_reason == "tool_calls" and msg.content is None and len(msg.tool_calls) == 1
        _check_call(msg.tool_calls[0], tools)
        if isinstance(choice, dict):
            assert msg.tool_calls[0].function.name == "add"


def test_a_streamed_tool_call_is_the_whole_answers(server):
    url, _ = server
    c = openai_client(url)
    kw = dict(model="tiny", messages=ASK, tools=[WEATHER, ADD], tool_choice="required", max_tokens=60)
    whole = c.chat.completions.create(**kw).choices[0]
    chunks = list(c.chat.completions.create(stream=True, **kw))
    calls = [t for ch in chunks for t in (ch.choices[0].delta.tool_calls or [])]
    assert len(calls) == 1 and calls[0].index == 0 and chunks[-1].choices[0].finish_reason == "tool_calls"
    assert (calls[0].function.name, json.loads(calls[0].function.arguments)) == \
        (whole.message.tool_calls[0].function.name, json.loads(whole.message.tool_calls[0].function.arguments))
    assert not "".join(ch.choices[0].delta.content or "" for ch in chunks)  # no JSON leaks as text


def test_auto_lets_the_model_choose_and_none_ignores_the_tools(server):
    url, model = server
    c = openai_client(url)
    seen = set()
    for seed in range(6):
        out = c.chat.completions.create(model="tiny", messages=ASK, tools=[WEATHER], max_tokens=60, temperature=1.0,
                                        seed=seed)
        msg = out.choices[0].message
        if msg.tool_calls:
            _check_call(msg.tool_calls[0], [WEATHER])
            seen.add("call")
        else:
            assert isinstance(msg.content, str) and out.choices[0].finish_reason in ("stop", "length")
            seen.add("text")
    assert seen  # every answer was a valid call or text (which one is the model's choice)
    plain = c.chat.completions.create(model="tiny", messages=ASK, max_tokens=10)
    none = c.chat.completions.create(model="tiny", messages=ASK, tools=[WEATHER], tool_choice="none", max_tokens=10)
    assert none.choices[0].message.content == plain.choices[0].message.content and not none.choices[0].message.tool_calls


def test_a_tool_conversation_is_rendered_by_the_template(server):
    url, model = server
    msgs = [{"role": "system", "content": [{"type": "text", "text": "be brief"}, {"type": "text", "text": "ok"}]},
            *ASK,
            {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": {
                "name": "weather", "arguments": '{"city": "paris", "days": 1}'}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]
    status, out = post_json(url, {"messages": msgs, "max_tokens": 5}, "/v1/chat/completions")
    assert status == 200, out
    _, ids = post_json(url, {"messages": msgs}, "/tokenize")
    call = json.dumps({"name": "weather", "arguments": {"city": "paris", "days": 1}})  # as the model writes one
    assert ids["tokens"] == model.tokenizer.encode(f"system: be brief\nok user: weather in paris assistant: {call} "
                                                   "tool: sunny assistant:")
    for bad, needle in (([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}],
                         "'image_url' part"),
                        ([{"role": "user", "content": None}], "null"),
                        ([{"role": "user", "content": "a", "tool_calls": []}], "only an assistant")):
        status, err = post_json(url, {"messages": bad, "max_tokens": 2}, "/v1/chat/completions")
        assert status == 400 and err["error"]["param"] == "messages" and needle in err["error"]["message"], err


def test_bad_tools_are_a_400_naming_the_field(server):
    url, _ = server
    cases = [({"tools": [{"type": "function"}]}, "tools"), ({"tools": [WEATHER], "tool_choice": "sometimes"}, "tool_choice"),
             ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "add"}}}, "tool_choice"),
             ({"tool_choice": "required"}, "tool_choice"), ({"tools": [WEATHER, WEATHER]}, "tools"),
             ({"tools": [WEATHER], "response_format": {"type": "json_object"}}, "response_format")]
    for extra, param in cases:
        status, err = post_json(url, {"messages": ASK, "max_tokens": 40, **extra}, "/v1/chat/completions")
        assert status == 400 and err["error"]["param"] == param, (extra, err)


def test_langchain_bind_tools_and_structured_output(server):
    langchain_openai = pytest.importorskip("langchain_openai")
    pydantic = pytest.importorskip("pydantic")
    url, _ = server

    class Add(pydantic.BaseModel):
        """add two numbers"""
        a: int = pydantic.Field(ge=0, le=99)
        b: int = pydantic.Field(ge=0, le=99)

    llm = langchain_openai.ChatOpenAI(model="tiny", base_url=url + "/v1", api_key="unused", max_tokens=60,
                                      max_retries=0, temperature=0)
    msg = llm.bind_tools([Add], tool_choice="required").invoke("add 2 and 3")
    assert len(msg.tool_calls) == 1 and msg.tool_calls[0]["name"] == "Add"
    Add(**msg.tool_calls[0]["args"])
    out = llm.with_structured_output(Add, method="function_calling").invoke("add 2 and 3")
    assert isinstance(out, Add)
    streamed = None
    for part in llm.bind_tools([Add], tool_choice="required").stream("add 2 and 3"):
        streamed = part if streamed is None else streamed + part
    assert streamed.tool_calls[0]["name"] == "Add" and streamed.tool_calls[0]["args"] == msg.tool_calls[0]["args"]


# -- the field audit ----------------------------------------------------------------------------------------

HONOURED = {"model", "stream", "stream_options", "max_tokens", "temperature", "top_p", "stop", "seed", "n", "logprobs",
            "response_format", "user", "prompt", "echo", "suffix", "messages", "max_completion_tokens",
            "top_logprobs", "tools", "tool_choice", "parallel_tool_calls", "metadata", "service_tier",
            "prompt_cache_key", "safety_identifier", *schemas.SETDLM_FIELDS}
# each refused field, a value it is refused with and one it is honoured with (its "off" value)
REFUSED = {"best_of": (2, 1), "frequency_penalty": (0.5, 0), "presence_penalty": (0.5, 0), "logit_bias": ({"5": 1}, {}),
           "store": (True, False), "modalities": (["text", "audio"], ["text"]), "audio": ({"voice": "x"}, None),
           "prediction": ({"type": "content", "content": "x"}, None), "reasoning_effort": ("low", None),
           "verbosity": ("low", None), "web_search_options": ({}, None), "functions": ([{"name": "f"}], None),
           "function_call": ("auto", None)}


def test_every_field_the_server_knows_is_listed_as_honoured_or_refused():
    known = set(schemas.BOTH) | set(schemas.COMPLETIONS_ONLY) | set(schemas.CHAT_ONLY) | set(schemas.SETDLM_FIELDS)
    assert known == HONOURED | set(REFUSED) and not HONOURED & set(REFUSED)
    assert set(schemas.REFUSED_UNLESS) == set(REFUSED)


def test_refused_fields_and_unknown_ones_are_a_400_naming_them(server):
    url, _ = server
    for field, (bad, ok) in REFUSED.items():
        path = "/v1/completions" if field in schemas.COMPLETIONS_ONLY else "/v1/chat/completions"
        base = {"prompt": "a"} if field in schemas.COMPLETIONS_ONLY else {"messages": ASK}
        status, err = post_json(url, {**base, "max_tokens": 2, field: bad}, path)
        assert status == 400 and err["error"]["param"] == field, (field, err)
        status, out = post_json(url, {**base, "max_tokens": 2, field: ok}, path)
        assert status == 200, (field, out)
    for path, body, field in (("/v1/completions", {"prompt": "a", "top_a": 1}, "top_a"),
                              ("/v1/completions", {"prompt": "a", "tools": [WEATHER]}, "tools"),
                              ("/v1/chat/completions", {"messages": ASK, "echo": True}, "echo")):
        status, err = post_json(url, {**body, "max_tokens": 2}, path)
        assert status == 400 and err["error"]["param"] == field and "unknown field" in err["error"]["message"], err
    status, out = post_json(url, {"messages": ASK, "max_tokens": 2, "user": "u1", "metadata": {"k": "v"},
                                  "parallel_tool_calls": False, "service_tier": "auto"}, "/v1/chat/completions")
    assert status == 200, out

