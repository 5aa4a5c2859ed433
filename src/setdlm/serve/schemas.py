"""Request bodies of the OpenAI-compatible API, parsed and validated (docs/serve.md).

Every problem becomes an :class:`APIError` carrying the OpenAI error shape
``{"error": {"message", "type", "param", "code"}}`` and its HTTP status: 400 naming the field, 404 for an
unknown model, 429 when the queue is full. Fields the server does not use (``user``, ``logprobs`` ...) are
ignored, as OpenAI-compatible servers do.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

from ..decoding.api import _encode_all
from ..decoding.settings import DecodeSettings


class APIError(Exception):
    """An error answered to the client: status, one-line message, the offending field."""

    def __init__(self, status: int, message: str, param: str | None = None, *, type: str = "invalid_request_error",
                 code: str | None = None, headers: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.type, self.code = status, message, param, type, code
        self.headers = headers or {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


@dataclass
class CompletionRequest:
    """A validated request: prompt token ids, streaming, the decoding settings (the request's ``max_tokens``
    is their ``max_new_tokens``) and the row's seed, for :func:`setdlm.decoding.session.prepare`."""

    chat: bool
    prompt_ids: list[int]
    stream: bool
    settings: DecodeSettings = field(default_factory=DecodeSettings)
    seed: int | None = None


ROLES = ("system", "user", "assistant", "tool", "developer")


def parse_request(raw: bytes, *, chat: bool, model, model_name: str, width: int) -> CompletionRequest:
    """Parse a ``/v1/completions`` (``chat=False``) or ``/v1/chat/completions`` body; raise APIError."""
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise APIError(400, f"malformed JSON body: {e}") from None
    if not isinstance(body, dict):
        raise APIError(400, f"the body must be a JSON object, got {type(body).__name__}")
    name = body.get("model", model_name)
    if name is not None and name != model_name:
        if not isinstance(name, str):
            raise APIError(400, f"model must be a string, got {name!r}", "model")
        raise APIError(404, f"model {name!r} not found; this server serves {model_name!r}", "model",
                       code="model_not_found")
    ids = _messages_ids(body, model) if chat else _prompt_ids(body, model)
    if len(ids) >= width:
        raise APIError(400, f"the prompt has {len(ids)} tokens; the context length is {width} (room for at least "
                            "one new token is needed)", "messages" if chat else "prompt")
    key = "max_completion_tokens" if chat and body.get("max_completion_tokens") is not None else "max_tokens"
    max_tokens = body.get(key)
    if max_tokens is None:
        max_tokens = min(64, width - len(ids))
    elif not _is_int(max_tokens) or max_tokens < 1:
        raise APIError(400, f"{key} must be a positive integer, got {max_tokens!r}", key)
    elif len(ids) + max_tokens > width:
        raise APIError(400, f"{key}={max_tokens} is too large: the prompt has {len(ids)} tokens and the context "
                            f"length is {width}, so at most {width - len(ids)} new tokens fit", key)
    stream = _get(body, "stream", bool, False)
    opts = body.get("stream_options")  # the last chunk always carries usage, as include_usage asks
    if opts is not None and not isinstance(opts, dict):
        raise APIError(400, f"stream_options must be an object, got {opts!r}", "stream_options")
    n = body.get("n", 1)
    if n is not None and n != 1:
        raise APIError(400, f"n={n!r} is not supported: one choice per request (send several requests; they are "
                            "batched)", "n")
    seed = body.get("seed")
    if seed is not None and not _is_int(seed):
        raise APIError(400, f"seed must be an integer, got {seed!r}", "seed")
    return CompletionRequest(chat, ids, stream, _settings(body, max_tokens), seed)


def _settings(body: dict, max_tokens: int) -> DecodeSettings:
    """The request's :class:`DecodeSettings`: the API's own bounds and JSON types here, every value's range
    checked by ``DecodeSettings`` itself; an error names the API field."""
    s = {}
    t = _number(body, "temperature", 0.0, 2.0, low_open=False)
    if t is not None:
        s["temperature"] = float(t)
    p = _number(body, "top_p", 0.0, 1.0, low_open=True)
    if p is not None:
        s["top_p"] = float(p)
    th = body.get("threshold")
    if th is not None:
        if not _is_number(th):
            raise APIError(400, f"threshold must be a number in (0, 1], got {th!r}", "threshold")
        s["threshold"] = float(th)
    rp = body.get("repetition_penalty")
    if rp is not None:  # its range is DecodeSettings' own check
        if not _is_number(rp):
            raise APIError(400, f"repetition_penalty must be a number > 0, got {rp!r}", "repetition_penalty")
        s["repetition_penalty"] = float(rp)
    for name, lo in (("window", 1), ("block_size", 1), ("top_k", 0)):
        v = body.get(name)
        if v is not None:
            if not _is_int(v) or v < lo:
                raise APIError(400, f"{name} must be an integer >= {lo}, got {v!r}", name)
            s[name] = v
    if body.get("cache_order") is not None:  # its values are DecodeSettings' own check
        s["cache_order"] = body["cache_order"]
    stop = body.get("stop")
    if stop is not None:
        stops = [stop] if isinstance(stop, str) else stop
        if not (isinstance(stops, list) and 1 <= len(stops) <= 4 and all(isinstance(x, str) and x for x in stops)):
            raise APIError(400, f"stop must be a non-empty string or a list of 1 to 4 of them, got {stop!r}", "stop")
        s["stop"] = stops
    if _get(body, "ignore_eos", bool, False):
        s["ignore_eos"] = True
    from .structured import BadStructure, constraint_of  # response_format, regex, choice (docs/decoding.md)

    try:
        constraint = constraint_of(body)
    except BadStructure as e:
        raise APIError(400, str(e), e.param) from None
    if constraint is not None:
        s["constraint"] = constraint
    try:
        return DecodeSettings(max_new_tokens=max_tokens, **s)
    except (ValueError, TypeError) as e:
        raise APIError(400, str(e), next((k for k in s if str(e).startswith(k)), None)) from None


def _prompt_ids(body: dict, model) -> list[int]:
    if "prompt" not in body:
        raise APIError(400, "prompt is required", "prompt")
    prompt = body["prompt"]
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
        if len(prompt) > 1:
            raise APIError(400, f"prompt holds {len(prompt)} prompts; send one per request (concurrent requests "
                                "are batched)", "prompt")
        prompt = prompt[0]  # OpenAI's batch form with one prompt
    if isinstance(prompt, str):
        if not prompt:
            raise APIError(400, "prompt must not be empty", "prompt")
    elif isinstance(prompt, list):
        vocab = getattr(model.tokenizer, "vocab_size", None) or float("inf")
        if not prompt or not all(_is_int(t) and 0 <= t < vocab for t in prompt):
            raise APIError(400, "prompt must be a non-empty string or a non-empty list of token ids below the "
                                f"vocabulary size {vocab}", "prompt")
        if model.family.mask_token_id in prompt:
            raise APIError(400, f"prompt contains the MASK id {model.family.mask_token_id}", "prompt")
    else:
        raise APIError(400, f"prompt must be a string or a list of token ids, got {type(prompt).__name__}", "prompt")
    if isinstance(prompt, str) and model.tokenizer is None:
        raise APIError(400, "this model has no tokenizer: send the prompt as token ids", "prompt")
    return _encode(model, prompt, "prompt")


def _messages_ids(body: dict, model) -> list[int]:
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise APIError(400, "messages must be a non-empty list of {role, content} objects", "messages")
    for i, m in enumerate(msgs):
        if not (isinstance(m, dict) and m.get("role") in ROLES and isinstance(m.get("content"), str)):
            raise APIError(400, f"messages[{i}] must be an object with a role in {ROLES} and a string content",
                           "messages")
    template = getattr(model.tokenizer, "chat_template", None)
    if not template:
        raise APIError(400, "this model's tokenizer has no chat template; use /v1/completions with a prompt",
                       "messages")
    return _encode(model, render_chat(template, msgs, model.tokenizer), "messages")


def _encode(model, prompt, param: str) -> list[int]:
    """Token ids as ``generate`` builds them ([BOS] + encode(text) for a string)."""
    try:
        return _encode_all(model, [prompt], "prompt", add_bos=True)[0]
    except (ValueError, KeyError, IndexError) as e:
        raise APIError(400, f"{param} cannot be encoded: {e}", param) from None


def render_chat(template: str, messages: list[dict], tokenizer) -> str:
    """Render a Hugging Face chat template (Jinja, sandboxed) with the generation prompt added."""
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise APIError(400, f"chat template: {message}", "messages")

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = raise_exception
    tokens = getattr(tokenizer, "tokens", {}) or {}
    return env.from_string(template).render(messages=messages, add_generation_prompt=True,
                                            bos_token="", eos_token=tokens.get("eos") or "")


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _number(body: dict, name: str, lo: float, hi: float, *, low_open: bool):
    v = body.get(name)
    if v is None:
        return None
    if not _is_number(v) or not ((lo < v) if low_open else (lo <= v)) or v > hi:
        interval = f"{'(' if low_open else '['}{lo:g}, {hi:g}]"
        raise APIError(400, f"{name} must be a number in {interval}, got {v!r}", name)
    return v


def _get(body: dict, name: str, kind: type, default):
    v = body.get(name, default)
    if v is None:
        return default
    if not isinstance(v, kind):
        raise APIError(400, f"{name} must be a {kind.__name__}, got {v!r}", name)
    return v
