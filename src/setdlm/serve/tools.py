"""Tool calls by construction, and the messages of a tool conversation (docs/serve.md, "Tools").

A chat request's ``tools`` (OpenAI's ``[{"type": "function", "function": {"name", "parameters", ...}}]``)
with ``tool_choice``:

* ``"required"``, or a named function (``{"type": "function", "function": {"name": ...}}``): the answer is
  constrained (the structured-output engine, docs/decoding.md "Constrained decoding") to a JSON call
  ``{"name": <one of the functions>, "arguments": <valid for its parameters schema>}``, valid by construction;
  the response carries it as ``tool_calls`` (``finish_reason`` ``"tool_calls"``, ``content`` null);
* ``"auto"`` (the default with tools): the answer is constrained to either such a call or
  ``{"content": "<text>"}``: the model chooses, and the response carries the call or the text;
* ``"none"``: the tools are neither shown to the model nor used.

The tools are passed to the chat template (``tools=``, as ``transformers`` passes them), which shows them to
the model where it has a tool format. Messages may hold content as a list of text parts (joined with newlines),
an assistant turn with ``tool_calls`` and null content, and ``tool`` messages; a template without a tool
format sees an assistant's calls as the JSON text the server makes the model write. Images, audio and files
are refused, naming the part.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass

from ..decoding.structured import constraint as c

TEXT_ANSWER = {"type": "object", "properties": {"content": {"type": "string"}}, "required": ["content"],
               "additionalProperties": False}


class BadTools(ValueError):
    """A tools field or message that cannot be honoured: the message and the field (``param``)."""

    def __init__(self, message: str, param: str):
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class Tools:
    """The tools a request offers (``functions``: name → parameters schema) and how the answer may use them
    (``mode``: ``"required"``, ``"auto"`` or a function's name)."""

    functions: dict
    mode: str
    listed: tuple  # the request's tools as given, for the chat template

    def schema(self) -> dict:
        """The JSON Schema the answer is constrained to."""
        names = list(self.functions) if self.mode in ("required", "auto") else [self.mode]
        calls = [{"type": "object", "properties": {"name": {"const": n}, "arguments": self.functions[n]},
                  "required": ["name", "arguments"], "additionalProperties": False} for n in names]
        options = calls + ([TEXT_ANSWER] if self.mode == "auto" else [])
        return options[0] if len(options) == 1 else {"anyOf": options}

    def constraint(self) -> c.Constraint:
        try:
            return c.json_schema(self.schema())
        except ValueError as e:
            raise BadTools(f"tools: a function's parameters cannot be enforced: {e}", "tools") from None


def parse_tools(body: dict) -> Tools | None:
    """The request's tools and tool choice (None: no tools, or ``tool_choice: "none"``)."""
    tools, choice = body.get("tools"), body.get("tool_choice")
    if tools is None:
        if choice not in (None, "none"):
            raise BadTools("tool_choice needs tools", "tool_choice")
        return None
    if not isinstance(tools, list) or not tools:
        raise BadTools("tools must be a non-empty list of {type: function, function: {name, parameters}}", "tools")
    functions = {}
    for i, t in enumerate(tools):
        f = t.get("function") if isinstance(t, dict) and t.get("type") == "function" else None
        if not isinstance(f, dict) or not isinstance(f.get("name"), str) or not f["name"]:
            raise BadTools(f"tools[{i}] must be {{type: function, function: {{name, parameters}}}}", "tools")
        params = f.get("parameters", {"type": "object", "properties": {}})
        if not isinstance(params, dict):
            raise BadTools(f"tools[{i}].function.parameters must be a JSON Schema object", "tools")
        if f["name"] in functions:
            raise BadTools(f"tools: the function {f['name']!r} is listed twice", "tools")
        functions[f["name"]] = params
    mode = _mode(choice, functions)
    return None if mode == "none" else Tools(functions, mode, tuple(tools))


def _mode(choice, functions: dict) -> str:
    if choice is None:
        return "auto"
    if choice in ("none", "auto", "required"):
        return choice
    name = choice.get("function", {}).get("name") if isinstance(choice, dict) and choice.get("type") == "function" \
        and isinstance(choice.get("function"), dict) else None
    if not isinstance(name, str):
        raise BadTools('tool_choice must be "none", "auto", "required" or {type: function, function: {name}}',
                       "tool_choice")
    if name not in functions:
        raise BadTools(f"tool_choice names {name!r}, which is not among the tools ({', '.join(functions)})",
                       "tool_choice")
    return name


def answer(text: str) -> tuple[str | None, list[dict] | None]:
    """``(content, tool_calls)`` of a constrained answer: a call becomes one tool call (its arguments as JSON
    text, as OpenAI sends them), ``{"content": ...}`` the text. The answer is always a whole document: every
    constrained row closes within its budget, and stop strings beside a constraint are refused."""
    value = json.loads(text)
    if "name" in value:
        call = {"id": "call_" + uuid.uuid4().hex[:24], "type": "function",
                "function": {"name": value["name"], "arguments": json.dumps(value["arguments"])}}
        return None, [call]
    return value["content"], None


# -- messages -----------------------------------------------------------------------------------------------

def normalize(messages: list, template: str) -> list[dict]:
    """The messages as the chat template gets them: content parts joined, a null content empty, an assistant's
    ``tool_calls`` kept for a template with a tool format, else written as the JSON the model wrote them in."""
    out = []
    knows_calls = "tool_calls" in template
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise BadTools(f"messages[{i}] must be an object with a role", "messages")
        m = dict(m)
        m["content"] = _content(m.get("content"), i, m["role"], bool(m.get("tool_calls")))
        calls = m.get("tool_calls")
        if calls is not None:
            if m["role"] != "assistant" or not isinstance(calls, list):
                raise BadTools(f"messages[{i}].tool_calls: only an assistant turn has tool_calls (a list)", "messages")
            m["tool_calls"] = [_call(x, i) for x in calls]
            if not knows_calls:
                written = [{"name": x["function"]["name"], "arguments": x["function"]["arguments"]} for x in
                           m.pop("tool_calls")]
                m["content"] = (m["content"] + "\n" if m["content"] else "") + "\n".join(json.dumps(w) for w in written)
        out.append(m)
    return out


def _content(content, i: int, role: str, has_calls: bool) -> str:
    if isinstance(content, str):
        return content
    if content is None:
        if role == "assistant" and has_calls:
            return ""
        raise BadTools(f"messages[{i}].content is null: only an assistant turn with tool_calls may omit it",
                       "messages")
    if not isinstance(content, list):
        raise BadTools(f"messages[{i}].content must be a string or a list of content parts", "messages")
    texts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind != "text" or not isinstance(part.get("text"), str):
            raise BadTools(f"messages[{i}].content[{j}] is a {kind!r} part: this server reads text parts only "
                           "(no images, audio or files)", "messages")
        texts.append(part["text"])
    return "\n".join(texts)


def _call(call, i: int) -> dict:
    f = call.get("function") if isinstance(call, dict) else None
    if not (isinstance(f, dict) and isinstance(f.get("name"), str)):
        raise BadTools(f"messages[{i}].tool_calls: each call is {{id, type: function, function: {{name, arguments}}}}",
                       "messages")
    args = f.get("arguments", "{}")
    try:
        parsed = json.loads(args) if isinstance(args, str) else args
    except json.JSONDecodeError:
        raise BadTools(f"messages[{i}].tool_calls: the arguments of {f['name']!r} are not JSON", "messages") from None
    return {"id": call.get("id"), "type": "function", "function": {"name": f["name"], "arguments": parsed}}
