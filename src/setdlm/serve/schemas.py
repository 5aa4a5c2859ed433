"""Request bodies of the OpenAI-compatible API, parsed and validated (docs/serve.md).

Every problem becomes an :class:`APIError` carrying the OpenAI error shape
``{"error": {"message", "type", "param", "code"}}`` and its HTTP status: 400 naming the field, 404 for an
unknown model, 429 when the queue is full. ``response_format`` (with setdlm's ``regex`` and ``choice``)
constrains the answer (``serve/structured.py``), ``suffix`` infills, ``logprobs`` / ``top_logprobs`` ask for
log-probabilities (``serve/logprobs.py``), ``n`` and a list of prompts ask for several choices. A body that is not
UTF-8 JSON, holds a lone surrogate, an integer of more than 4300 digits or objects nested deeper than
``MAX_DEPTH`` is a 400.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from ..chat import ROLES, chat_prompt
from ..data.prompt import check_prompt_fits, encode_prompts
from ..decoding.request import REQUEST_FIELDS, is_int, request_settings, short
from ..decoding.settings import DecodeSettings, default_max_new_tokens
from ..errors import UserError
from ..seeds import SEED_RANGE
from .structured import BadStructure, constraint_of
from .tools import BadTools, Tools, normalize, parse_tools


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
    """A validated request: the prompts' token ids (one, or a completions request's list), streaming, the
    decoding settings (the request's ``max_tokens`` is their ``max_new_tokens``; 0, with ``echo``: no decoding)
    and the seed, for :func:`setdlm.decoding.session.prepare`; ``n`` choices per prompt."""

    chat: bool
    prompts: list[list[int]]
    stream: bool
    settings: DecodeSettings = field(default_factory=DecodeSettings)
    seed: int | None = None
    echo: list[str] | None = None  # each prompt's text, sent before its answers (completions' ``echo``)
    suffix: list[int] | None = None  # infilling: the suffix's token ids; the answer is the middle
    n: int = 1  # choices per prompt
    logprobs: int | None = None  # the alternatives per token (0: the chosen token's only); None: no logprobs
    max_tokens: int = 1  # 0: echo the prompt without decoding
    tools: Tools | None = None  # chat: the answer is a tool call (or, "auto", text) by construction
    constraint_param: str | None = None  # the field that asked for the constraint (its errors name it)

    @property
    def prompt_ids(self) -> list[int]:
        """The first prompt's ids."""
        return self.prompts[0]

    @property
    def prompt_tokens(self) -> int:
        """Tokens of context the request sent (every prompt and suffix), as ``usage`` counts them."""
        return sum(len(p) + len(self.suffix or ()) for p in self.prompts)

    def choices(self) -> list[tuple[int, int]]:
        """``(prompt index, sample index)`` of each choice, in OpenAI's order: ``index = prompt * n + sample``."""
        return [(p, j) for p in range(len(self.prompts)) for j in range(self.n)]




def read_body(raw: bytes, model_name: str) -> dict:
    """A request body as a JSON object, every value checked (:func:`_check_values`), its ``model`` (if given)
    the one served; raise APIError."""
    try:
        body = json.loads(raw)
    except UnicodeDecodeError as e:
        raise APIError(400, f"the body is not valid UTF-8: {e}") from None
    except RecursionError:
        raise APIError(400, f"the JSON body is nested too deeply (at most {MAX_DEPTH} levels)") from None
    except ValueError as e:  # JSONDecodeError, or an integer literal of more than 4300 digits
        raise APIError(400, f"malformed JSON body: {str(e).splitlines()[0][:200]}") from None
    if not isinstance(body, dict):
        raise APIError(400, f"the body must be a JSON object, got {type(body).__name__}")
    _check_values(body)
    name = body.get("model", model_name)
    if name is not None and name != model_name:
        if not isinstance(name, str):
            raise APIError(400, f"model must be a string, got {short(name)}", "model")
        raise APIError(404, f"model {short(name)} not found; this server serves {model_name!r}", "model",
                       code="model_not_found")
    return body


def parse_request(raw: bytes, *, chat: bool, model, model_name: str, width: int) -> CompletionRequest:
    """Parse a ``/v1/completions`` (``chat=False``) or ``/v1/chat/completions`` body; raise APIError."""
    body = read_body(raw, model_name)
    check_fields(body, chat)
    try:
        tools = parse_tools(body) if chat else None
    except BadTools as e:
        raise APIError(400, str(e), e.param) from None
    prompts = [_messages_ids(body, model, tools)] if chat else _prompts(body, model)
    suffix = None if chat else _suffix_ids(body, model)
    echo = None if chat else _echo(body, model, prompts)
    max_tokens = _max_tokens(body, chat, width, max(len(p) for p in prompts) + len(suffix or ()), echo is not None)
    stream = _get(body, "stream", bool, False)
    opts = body.get("stream_options")  # the last chunk always carries usage, as include_usage asks
    if opts is not None and not isinstance(opts, dict):
        raise APIError(400, f"stream_options must be an object, got {short(opts)}", "stream_options")
    seed = body.get("seed")
    if seed is not None and not (is_int(seed) and SEED_RANGE[0] <= seed <= SEED_RANGE[1]):
        raise APIError(400, f"seed must be an integer in [-2**63, 2**64 - 1], got {short(seed)}", "seed")
    settings = _settings(body, max(max_tokens, 1), width, tools)
    logprobs = _logprobs(body, chat, settings)
    if echo is not None and logprobs is not None and not model.family.spec.ordered:
        raise APIError(400, "echo with logprobs (the prompt's log-probabilities) is defined for models that predict "
                            f"every token in one order (AR, SetDLM), not for the {model.family.family} family", "echo")
    asked = "tools" if tools is not None else next((k for k in ("response_format", "regex", "choice")
                                                    if body.get(k) is not None), None)
    return CompletionRequest(chat, prompts, stream, settings, seed, echo, suffix, _n(body, settings), logprobs,
                             max_tokens, tools, asked if settings.constraint is not None else None)


def _max_tokens(body: dict, chat: bool, width: int, fixed: int, echo: bool) -> int:
    """The answer's budget: ``max_tokens`` (chat: ``max_completion_tokens`` first), by default what the context
    leaves; 0 only with ``echo`` (the prompt alone, e.g. its logprobs). ``fixed``: the longest prompt + suffix."""
    try:  # the one prompt-length rule (setdlm.data.prompt), worded as Python and the CLI word it
        check_prompt_fits(fixed, width, "prompt + suffix" if body.get("suffix") else "prompt")
    except ValueError as e:
        raise APIError(400, str(e), "messages" if chat else "prompt") from None
    key = "max_completion_tokens" if chat and body.get("max_completion_tokens") is not None else "max_tokens"
    max_tokens = body.get(key)
    if max_tokens is None:
        return default_max_new_tokens("server", room=width - fixed)
    if not is_int(max_tokens) or max_tokens < (0 if echo else 1):
        raise APIError(400, f"{key} must be a positive integer{' (or 0 with echo)' if not chat else ''}, got "
                            f"{short(max_tokens)}", key)
    if fixed + max_tokens > width:
        raise APIError(400, f"{key}={max_tokens} is too large: the "
                            f"prompt{' and suffix have' if body.get('suffix') else ' has'} "
                            f"{fixed} tokens and the context length is {width}, so at most {width - fixed} new tokens "
                            "fit", key)
    return max_tokens


MAX_N = 16  # choices per request (n times the prompts of a list)
MAX_LOGPROBS = 20  # alternatives per token


def _n(body: dict, settings: DecodeSettings) -> int:
    """``n``: independent samples per prompt (each its own seed stream). Greedy decoding gives ``n`` identical
    choices, so ``n > 1`` with temperature 0 is refused unless ``greedy_copies`` asks for the copies."""
    n = body.get("n")
    if n is None:
        return 1
    if not is_int(n) or not 1 <= n <= MAX_N:
        raise APIError(400, f"n must be an integer in [1, {MAX_N}], got {short(n)}", "n")
    copies = _get(body, "greedy_copies", bool, False)
    if n > 1 and settings.temperature == 0 and not copies:
        raise APIError(400, f"n={n} with greedy decoding (temperature 0) gives {n} identical choices: set a "
                            "temperature > 0 to sample, or greedy_copies: true for the copies", "n")
    return n


def _logprobs(body: dict, chat: bool, settings: DecodeSettings) -> int | None:
    """The alternatives per token the answer's logprobs list (0: only the chosen token's), None without
    logprobs. Completions: ``logprobs`` is that number; chat: ``logprobs: true`` and ``top_logprobs``."""
    lp, top = body.get("logprobs"), body.get("top_logprobs")
    if chat:
        if lp is not None and not isinstance(lp, bool):
            raise APIError(400, f"logprobs must be a boolean for chat completions, got {short(lp)}", "logprobs")
        if top is not None and not lp:
            raise APIError(400, "top_logprobs needs logprobs: true", "top_logprobs")
        k = (top or 0) if lp else None
        param = "top_logprobs"
    else:
        if top is not None:
            raise APIError(400, "top_logprobs is a chat completions field; completions take logprobs: N (the "
                                "alternatives per token)", "top_logprobs")
        if lp is False:
            lp = None
        k, param = lp, "logprobs"
    if k is None:
        return None
    if not is_int(k) or not 0 <= k <= MAX_LOGPROBS:
        raise APIError(400, f"{param} must be an integer in [0, {MAX_LOGPROBS}], got {short(k)}", param)
    return k


def _echo(body: dict, model, prompts: list[list[int]]) -> list[str] | None:
    """Completions' ``echo``: each prompt's text, put before its answers (None without echo)."""
    if not _get(body, "echo", bool, False):
        return None
    if model.tokenizer is None:
        raise APIError(400, "echo needs the model's tokenizer to turn the prompt into text", "echo")
    given = body["prompt"] if isinstance(body["prompt"], list) and body["prompt"] and \
        isinstance(body["prompt"][0], (str, list)) else [body["prompt"]]
    return [g if isinstance(g, str) else model.tokenizer.decode(ids) for g, ids in zip(given, prompts)]


MAX_DEPTH = 32  # nesting levels of a request body

# Every request field the server knows, each honoured or refused (docs/serve.md "Compatibility"; a field not
# listed is a 400). OpenAI's fields of both endpoints, then each endpoint's, then setdlm's own.
BOTH = ("model", "stream", "stream_options", "max_tokens", "temperature", "top_p", "stop", "seed", "n", "logprobs",
        "response_format", "user", "frequency_penalty", "presence_penalty", "logit_bias")
COMPLETIONS_ONLY = ("prompt", "echo", "suffix", "best_of")
CHAT_ONLY = ("messages", "max_completion_tokens", "top_logprobs", "tools", "tool_choice", "parallel_tool_calls",
             "metadata", "store", "service_tier", "modalities", "audio", "prediction", "reasoning_effort",
             "web_search_options", "functions", "function_call", "verbosity", "prompt_cache_key", "safety_identifier")
# setdlm's own: every DecodeSettings field a request sets by name that OpenAI has not (its request metadata,
# setdlm.decoding.request), then the constraints besides response_format and greedy_copies
SETDLM_FIELDS = (*(name for name in REQUEST_FIELDS if name not in BOTH), "regex", "choice", "greedy_copies")
# field -> (the values it is honoured with, why any other is refused)
REFUSED_UNLESS = {
    "best_of": ((None, 1), "best_of is not supported: n returns every sample, none is chosen for you"),
    "frequency_penalty": ((None, 0), "frequency_penalty is not supported: use repetition_penalty (HF's rule)"),
    "presence_penalty": ((None, 0), "presence_penalty is not supported: use repetition_penalty (HF's rule)"),
    "logit_bias": ((None, {}), "logit_bias is not supported"),
    "store": ((None, False), "store is not supported: this server keeps no answers"),
    "modalities": ((None, ["text"]), "modalities: this server answers text only"),
    "audio": ((None,), "audio output is not supported"),
    "prediction": ((None,), "prediction (predicted outputs) is not supported"),
    "reasoning_effort": ((None,), "reasoning_effort is not supported"),
    "verbosity": ((None,), "verbosity is not supported"),
    "web_search_options": ((None,), "web search is not supported"),
    "functions": ((None,), "functions (deprecated) is not supported: use tools"),
    "function_call": ((None,), "function_call (deprecated) is not supported: use tool_choice"),
}


def check_fields(body: dict, chat: bool) -> None:
    """Every field of ``body`` known to the endpoint and, where the server cannot honour some values (a
    penalty it does not implement, an output it cannot make), given a value it honours; else a 400 naming it."""
    known = set(BOTH) | set(SETDLM_FIELDS) | set(CHAT_ONLY if chat else COMPLETIONS_ONLY)
    for key in body:
        if key not in known:
            other = "/v1/completions" if key in COMPLETIONS_ONLY else "/v1/chat/completions" if key in CHAT_ONLY \
                else None
            where = f" (a field of {other})" if other else ""
            raise APIError(400, f"unknown field {short(key)}{where}: this endpoint does not take it", key)
        if key in REFUSED_UNLESS and not any(body[key] == ok and type(body[key]) is type(ok) or body[key] is ok
                                             for ok in REFUSED_UNLESS[key][0]):
            raise APIError(400, f"{REFUSED_UNLESS[key][1]} (got {short(body[key])})", key)


def _check_values(body: dict) -> None:
    """Every string of the body encodable (no lone surrogate), and no deeper than ``MAX_DEPTH``; an error
    names the top-level field."""
    todo = [(v, k, 1) for k, v in body.items()]
    while todo:
        v, field, depth = todo.pop()
        if depth > MAX_DEPTH:
            raise APIError(400, f"{field} is nested too deeply (at most {MAX_DEPTH} levels)", field)
        if isinstance(v, str):
            try:
                v.encode("utf-8")
            except UnicodeEncodeError:
                raise APIError(400, f"{field} holds a lone surrogate (\\u{ord(v[_surrogate(v)]):04x}), which is "
                                    "not text", field) from None
        elif isinstance(v, dict):
            todo += [(x, field, depth + 1) for x in v.values()] + [(k, field, depth + 1) for k in v]
        elif isinstance(v, list):
            todo += [(x, field, depth + 1) for x in v]


def _surrogate(text: str) -> int:
    return next(i for i, c in enumerate(text) if 0xD800 <= ord(c) <= 0xDFFF)


TEMPERATURE_FLOOR = 1e-3


def _settings(body: dict, max_tokens: int, width: int, tools: Tools | None = None) -> DecodeSettings:
    """The request's :class:`DecodeSettings`: the fields a request sets by name read by
    :func:`~setdlm.decoding.request.request_settings` (their JSON types and the API's bounds; a window or block
    wider than the canvas ``width`` is refused: it cannot be decoded), the constraint of ``response_format``,
    ``regex``, ``choice`` or ``tools``; every value's range checked by ``DecodeSettings`` itself; an error names
    the API field."""
    try:
        s = request_settings(body, width)
    except UserError as e:
        raise APIError(400, str(e), e.fields[0]) from None
    if s.get("temperature", 1.0) < TEMPERATURE_FLOOR:  # greedy: sampling is greedy there up to ties (and 1e-300
        s["temperature"] = 0.0                         # would overflow)
    if s.get("verify_layout") not in (None, "auto") and s.get("speculate") is not True:  # nothing to lay out
        raise APIError(400, "verify_layout lays out the self-speculative decode's verification; it applies with "
                            "speculate=true only", "verify_layout")
    try:
        constraint = constraint_of(body)
        if tools is not None:
            if constraint is not None:
                raise BadStructure("tools constrain the answer already: give response_format, regex or choice "
                                   "without tools", next(k for k in ("response_format", "regex", "choice")
                                                         if body.get(k) is not None))
            constraint = tools.constraint()
    except (BadStructure, BadTools) as e:
        raise APIError(400, str(e), e.param) from None
    if constraint is not None:
        s["constraint"] = constraint
    try:
        return DecodeSettings(max_new_tokens=max_tokens, **s)
    except (ValueError, TypeError) as e:
        raise APIError(400, str(e), param_of(e, next((k for k in s if str(e).startswith(k)), None))) from None


# the library's argument names that a request spells otherwise
_PARAMS = {"max_new_tokens": "max_tokens", "json_schema": "response_format"}  # library argument -> request field


def param_of(error: Exception, default: str | None = None) -> str | None:
    """The request field a library error names (the first of a ``UserError``'s ``fields``, as the request
    spells it), else ``default``."""
    fields = getattr(error, "fields", ())
    return _PARAMS.get(fields[0], fields[0]) if fields else default


def _prompts(body: dict, model) -> list[list[int]]:
    """The prompts of a completions request as token ids: one prompt (a string or token ids), or OpenAI's
    list of them (strings or token-id lists), at most :data:`MAX_N`."""
    if "prompt" not in body:
        raise APIError(400, "prompt is required", "prompt")
    prompt = body["prompt"]
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
        if len(prompt) > MAX_N:
            raise APIError(400, f"prompt holds {len(prompt)} prompts; at most {MAX_N} per request", "prompt")
        return [_prompt_ids(p, model, f"prompt[{i}]") for i, p in enumerate(prompt)]
    return [_prompt_ids(prompt, model, "prompt")]


def _prompt_ids(prompt, model, where: str) -> list[int]:
    """One prompt (a string or token ids, taken as they come) as token ids; an error names ``where``."""
    if isinstance(prompt, str):
        if not prompt:
            raise APIError(400, f"{where} must not be empty", "prompt")
    elif isinstance(prompt, list):
        vocab = getattr(model.tokenizer, "vocab_size", None) or float("inf")
        if not prompt or not all(is_int(t) and 0 <= t < vocab for t in prompt):
            raise APIError(400, f"{where} must be a non-empty string or a non-empty list of token ids below the "
                                f"vocabulary size {vocab}", "prompt")
        if model.family.mask_token_id in prompt:
            raise APIError(400, f"{where} contains the MASK id {model.family.mask_token_id}", "prompt")
    else:
        raise APIError(400, f"{where} must be a string or a list of token ids, got {type(prompt).__name__}", "prompt")
    if isinstance(prompt, str) and model.tokenizer is None:
        raise APIError(400, "this model has no tokenizer: send the prompt as token ids", "prompt")
    return _encode(model, prompt, "prompt")


def _suffix_ids(body: dict, model) -> list[int] | None:
    """The ``suffix`` of a completion as token ids (None without one): the row then infills, the prompt
    and suffix cached, the ``max_tokens`` between them decoded (docs/method.md §4.6). Generate-only fields
    (``stop``, ``ignore_eos``, ``cache_order``) do not apply to it."""
    suffix = body.get("suffix")
    if suffix is None or suffix == "":
        return None
    if not isinstance(suffix, str):
        raise APIError(400, f"suffix must be a string, got {short(suffix)}", "suffix")
    if model.tokenizer is None:
        raise APIError(400, "this model has no tokenizer: a suffix needs one", "suffix")
    for name in ("stop", "ignore_eos", "cache_order"):
        if body.get(name) not in (None, False):
            raise APIError(400, f"{name} does not apply with a suffix: the middle is exactly max_tokens long", name)
    try:
        ids = encode_prompts(model, [suffix], "suffix", allow_empty=True)[0]
    except (ValueError, KeyError, IndexError) as e:
        raise APIError(400, f"suffix cannot be encoded: {e}", "suffix") from None
    if model.family.mask_token_id in ids:
        raise APIError(400, f"suffix contains the MASK id {model.family.mask_token_id}", "suffix")
    return ids


def _messages_ids(body: dict, model, tools: Tools | None = None) -> list[int]:
    """The chat's ids (the library's chat path): its messages (text content parts joined, tool calls and
    results as ``serve/tools.py`` renders them) and ``tools`` through the model's chat template."""
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise APIError(400, "messages must be a non-empty list of {role, content} objects", "messages")
    for i, m in enumerate(msgs):
        if not (isinstance(m, dict) and m.get("role") in ROLES):
            raise APIError(400, f"messages[{i}] must be an object with a role in {ROLES}", "messages")
    template = getattr(model.tokenizer, "chat_template", None)
    if not template:
        raise APIError(400, "this model's tokenizer has no chat template; use /v1/completions with a prompt",
                       "messages")
    try:  # the library's chat path (setdlm.chat): template special tokens as their ids, no extra BOS
        messages = normalize(msgs, template)
        ids = chat_prompt(model.tokenizer, messages) if tools is None else \
            chat_prompt(model.tokenizer, messages, tools=list(tools.listed))
    except BadTools as e:
        raise APIError(400, str(e), e.param) from None
    except ValueError as e:
        raise APIError(400, str(e), "messages") from None
    return _encode(model, ids, "messages")


def _encode(model, prompt, param: str) -> list[int]:
    """Token ids as ``generate`` builds them ([BOS] + encode(text) for a string)."""
    try:
        return encode_prompts(model, [prompt], "prompt", add_bos=True)[0]
    except (ValueError, KeyError, IndexError) as e:
        raise APIError(400, f"{param} cannot be encoded: {e}", param) from None


def _get(body: dict, name: str, kind: type, default):
    v = body.get(name, default)
    if v is None:
        return default
    if not isinstance(v, kind):
        raise APIError(400, f"{name} must be a {kind.__name__}, got {short(v)}", name)
    return v
