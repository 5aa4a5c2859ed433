"""Chat messages as token ids: the one chat path of the Python API, ``setdlm generate --chat`` and the
server's ``/v1/chat/completions`` (docs/pretrained.md, "Prompts and chat").

A pretrained chat model was trained on its chat template's layout, so a conversation is decoded from
exactly the ids ``transformers`` gives for it::

    tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)

that is: the tokenizer's chat template (Jinja) rendered in ``transformers``' sandbox (``trim_blocks``,
``lstrip_blocks``, ``loopcontrols``, its ``tojson``, ``raise_exception`` and ``strftime_now``) with the
special tokens' strings as ``bos_token``, ``eos_token``, ..., then encoded with the template's special tokens
(``<|im_start|>`` ...) as their ids and nothing added: no extra BOS. Rendering needs only ``jinja2`` (the
``serve`` extra), not ``transformers``.

The decoding side: the model's end-of-turn ids (the tokenizer's EOS and the generation config's EOS ids,
``<|im_end|>`` for SmolLM2) stop every row unless ``ignore_eos``
(:func:`setdlm.decoding.api.end_of_turn_ids`).
"""

from __future__ import annotations

import json
from datetime import datetime

from .errors import UserError

ROLES = ("system", "user", "assistant", "tool", "developer")
SPECIAL_ROLES = ("bos", "eos", "unk", "pad", "mask")


def check_messages(messages) -> list[dict]:
    """``messages`` as a list of ``{"role", "content", ...}`` dicts (a string is one user message); a
    ``ValueError`` naming the first bad message otherwise."""
    if isinstance(messages, str):
        return [{"role": "user", "content": messages}]
    if not isinstance(messages, (list, tuple)) or not messages:
        raise UserError("messages must be a string or a non-empty list of {role, content} objects")
    for i, m in enumerate(messages):
        if not (isinstance(m, dict) and m.get("role") in ROLES and isinstance(m.get("content"), str)):
            raise UserError(f"messages[{i}] must be an object with a role in {ROLES} and a string content")
    return [dict(m) for m in messages]


def render(template: str, messages: list[dict], *, special_tokens: dict[str, str | None] | None = None,
           add_generation_prompt: bool = True, **template_kwargs) -> str:
    """The chat template rendered as ``transformers``' ``apply_chat_template(..., tokenize=False)`` renders
    it. ``special_tokens``: ``{"bos": "<s>", ...}`` (passed as ``bos_token`` ...). A template error (including
    its own ``raise_exception``) is a ``ValueError``."""
    try:
        import jinja2
        from jinja2.ext import loopcontrols
        from jinja2.sandbox import ImmutableSandboxedEnvironment
    except ImportError:
        raise UserError("chat templates need jinja2: pip install 'setdlm[serve]'") from None

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals.update(raise_exception=raise_exception, strftime_now=lambda fmt: datetime.now().strftime(fmt))
    tokens = {f"{role}_token": tok for role, tok in (special_tokens or {}).items() if tok is not None}
    context = {"tools": None, "documents": None, **tokens, **template_kwargs}  # as transformers passes them
    try:
        return env.from_string(template).render(messages=messages, add_generation_prompt=add_generation_prompt,
                                                **context)
    except jinja2.exceptions.TemplateError as e:
        raise UserError(f"chat template: {e}") from None


def chat_prompt(tokenizer, messages, *, add_generation_prompt: bool = True, **template_kwargs) -> list[int]:
    """Token ids of ``messages`` (a list of ``{"role", "content"}``; a string is one user message) as
    ``transformers``' ``apply_chat_template(messages, add_generation_prompt=True, tokenize=True)`` gives
    them: the template's special tokens as their ids, no BOS added. Pass the ids to ``generate`` as they
    are. ``tokenizer``: a :class:`setdlm.data.Tokenizer` or :class:`setdlm.formats.hf.HFTokenizer` with a chat
    template."""
    template = getattr(tokenizer, "chat_template", None)
    if not isinstance(template, str) or not template:
        raise UserError("the model's tokenizer has no chat template; pass a plain prompt")
    messages = check_messages(messages)
    special = {r: getattr(tokenizer, "tokens", {}).get(r) for r in SPECIAL_ROLES}
    text = render(template, messages, special_tokens=special, add_generation_prompt=add_generation_prompt,
                  **template_kwargs)
    encode = getattr(tokenizer, "encode_special", None) or tokenizer.encode  # a duck type may have no specials
    return list(encode(text))
