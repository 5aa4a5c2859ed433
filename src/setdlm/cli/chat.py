"""``setdlm run MODEL "prompt"`` and ``setdlm chat MODEL``: Ollama's habits on setdlm's decoders.

``run`` answers one prompt (through the model's chat template when it has one, with ``--system``; a plain
continuation otherwise) and prints the text alone. ``chat`` reads turns from stdin until ``/bye`` or the end
of input and answers each with the whole conversation so far (the system message first), through the chat
template; the oldest turns leave when the conversation would leave less room than the answer's budget.
Both make the library's calls: :func:`setdlm.chat.chat_prompt` and :func:`setdlm.decoding.generate`.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

from ..chat import chat_prompt
from ..decoding import generate
from ..decoding.output import GenerationOutput
from ..decoding.settings import MAX_NEW_TOKENS, DecodeSettings
from ..errors import UserError
from .flags import SETTINGS, add_model_flags, add_settings_flags, decode_settings

Message = dict[str, str]


def has_template(model) -> bool:
    """Whether the model's tokenizer has a chat template."""
    template = getattr(model.tokenizer, "chat_template", None)
    return isinstance(template, str) and bool(template)


def conversation_ids(model, messages: list[Message], settings: DecodeSettings) -> tuple[list[int], list[Message]]:
    """The ids of ``messages`` through the chat template, and the messages kept: the oldest user/assistant
    turns (never the system message, never the last turn) leave until the ids leave room for the answer's
    budget (``max_new_tokens``, or min(256, a quarter of the context))."""
    L = model.family.length
    room = settings.max_new_tokens or min(MAX_NEW_TOKENS, max(L // 4, 1))
    kept = list(messages)
    ids = chat_prompt(model.tokenizer, kept)
    while len(ids) + room > L:
        first = next((i for i, m in enumerate(kept) if m["role"] != "system"), None)
        if first is None or first == len(kept) - 1:
            break  # the last turn alone: generate says what does not fit
        del kept[first:first + 2]  # a user turn and the answer to it
        ids = chat_prompt(model.tokenizer, kept)
    return ids, kept


def answer(model, prompt: str, settings: DecodeSettings, *, system: str | None = None, seed: int = 0) -> str:
    """``setdlm run``: the answer to ``prompt``, through the chat template when the model has one."""
    if has_template(model):
        messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]
        ids, _ = conversation_ids(model, messages, settings)
        return _text(generate(model, [ids], settings, seed=seed, progress=True))
    if system:
        raise UserError("system applies to a model with a chat template; this model's tokenizer has none",
                        fields=("system",))
    return _text(generate(model, [prompt], settings, seed=seed, progress=True))


def _text(out: GenerationOutput) -> str:
    """The one row's text (a model that takes text has a tokenizer, so the output has texts)."""
    assert out.texts is not None
    return out.texts[0]


def chat(model, settings: DecodeSettings, *, system: str | None = None, seed: int = 0,
         read: Callable[[], str | None] | None = None, write: Callable[[str], None] = print) -> list[Message]:
    """``setdlm chat``: turns from ``read`` (default: stdin lines) until ``/bye`` or the end of input, each
    answered with the conversation so far and written by ``write``; ``/clear`` forgets the turns (the system
    message stays). Returns the conversation."""
    if not has_template(model):
        raise UserError("chat needs a model whose tokenizer has a chat template (e.g. smollm2-135m); for a "
                        "continuation use setdlm run MODEL \"PROMPT\" or setdlm generate")
    read = read or _stdin_line
    start = [{"role": "system", "content": system}] if system else []
    messages = list(start)
    while (line := read()) is not None and line.strip() not in ("/bye", "/exit"):
        if line.strip() == "/clear":
            messages = list(start)
            continue
        if not line.strip():
            continue
        ids, messages = conversation_ids(model, messages + [{"role": "user", "content": line}], settings)
        text = _text(generate(model, [ids], settings, seed=seed))
        write(text)
        messages.append({"role": "assistant", "content": text})
    return messages


def _stdin_line() -> str | None:
    """One line of stdin without its newline (a ``>>>`` prompt on a terminal); None at the end of input."""
    if sys.stdin.isatty():
        print(">>> ", end="", file=sys.stderr, flush=True)
    line = sys.stdin.readline()
    return line.rstrip("\n") if line else None


# ---------------------------------------------------------------------------------------------------------
# the commands
# ---------------------------------------------------------------------------------------------------------


def _answer(args) -> int:
    """Answer one prompt, Ollama-style: through the model's chat template when it has one (--system), else a
    continuation; prints the text alone."""
    model, settings = _loaded(args)
    print(answer(model, args.prompt, settings, system=args.system, seed=args.seed))
    return 0


def _chat(args) -> int:
    """Chat with a model that has a chat template: each line of stdin is a turn, answered with the whole
    conversation so far (--system first); /clear forgets it, /bye (or the end of input) ends."""
    model, settings = _loaded(args)
    chat(model, settings, system=args.system, seed=args.seed)
    return 0


def _loaded(args):
    """The model of ``args`` and its decoding settings, checked against its family."""
    settings = decode_settings(args)
    model = args.model_choice(args).load()
    settings.check_for(model.family.family)
    return model, settings


def add_conversation_commands(sub, summary, model_choice) -> None:
    """``setdlm run`` and ``setdlm chat`` on the subparsers ``sub`` (``summary``: a command's one-line help;
    ``model_choice``: the :class:`~setdlm.cli.options.ModelChoice` of parsed flags)."""
    for name, func in (("run", _answer), ("chat", _chat)):
        p = sub.add_parser(name, help=summary(func), description=func.__doc__)
        p.add_argument("checkpoint", metavar="MODEL", help="checkpoint or run folder, shipped or packaged model name "
                       "(smollm2-135m), GGUF file or Hub id")
        if name == "run":
            p.add_argument("prompt", help="the prompt")
        p.add_argument("--system", default=None, help="a system message first (a model with a chat template)")
        add_settings_flags(p, tuple(n for n in SETTINGS if n != "stop"))
        p.add_argument("--seed", type=int, default=0, help="sampling seed")
        add_model_flags(p)
        p.set_defaults(func=func, model_choice=model_choice)
