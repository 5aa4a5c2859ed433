"""The one error type for bad input: :class:`UserError` (docs/errors.md).

The library raises :class:`UserError` where it detects bad input from its caller (a value out of range, a
missing file, a setting of another family, a prompt too long for the context). It is a ``ValueError``, so
``except ValueError`` keeps catching it. The commands (:func:`setdlm.cli.command.run`) turn only these into
one line and exit code 2; any other exception is a bug and shows its traceback.

A message is worded for the library: it names a field or argument (``level``, ``max_new_tokens``), and
``fields`` lists the names in it that the command line spells as flags (``--level``,
``--max-new-tokens``): :func:`as_flags` rewrites them.
"""

from __future__ import annotations

import re


class UserError(ValueError):
    """Bad input from the caller, detected by the library; ``fields``: the argument names the message uses."""

    def __init__(self, message: str, *, fields: tuple[str, ...] = ()):
        super().__init__(message)
        self.fields = tuple(fields)


class InputWarning(UserWarning):
    """A setting that works but will likely not do what the caller expects (decoding past the context, a
    window wider than the model was trained for); ``fields`` as :class:`UserError`'s: the command line prints
    it as one ``warning:`` line with the names as flags."""

    def __init__(self, message: str, *, fields: tuple[str, ...] = ()):
        super().__init__(message)
        self.fields = tuple(fields)


# the library's words for "not set", as the command line says them
_UNSET = {"(leave it None)": "(leave the flag out)", " (or None)": " (or leave the flag out)",
          " or be None (off)": " or be left out (off)"}


def as_flags(error: UserError | InputWarning, value_flags: dict[str, tuple[str, ...]] | None = None) -> str:
    """The message of ``error`` with each name of ``error.fields`` written as its command-line flag
    (``max_new_tokens`` -> ``--max-new-tokens``, ``quantize='gguf'`` -> ``--quantize gguf``) and the
    library's "None" as leaving the flag out; names inside other words, paths or quotes are left alone.
    ``value_flags``: per field, the values the command line spells as a flag of their own
    (``{"speculate": ("next_token",)}``: ``speculate='next_token'`` -> ``--speculate-next-token``)."""
    text = str(error)
    for name in error.fields:
        flag, bare = "--" + name.replace("_", "-"), rf"(?<![\w.\-/'\"]){re.escape(name)}"
        for value in (value_flags or {}).get(name, ()):
            text = re.sub(bare + rf"=(['\"]){re.escape(value)}\1", f"{flag}-{value.replace('_', '-')}", text)
        text = re.sub(bare + r"=True\b", flag, text)  # a switch: resume=True -> --resume
        text = re.sub(bare + r"=(['\"]?)([\w.+-]*)\1", rf"{flag} \2", text)
        text = re.sub(bare + r"(?![\w.\-/'\"])", flag, text)
    if error.fields:
        for words, flag_words in _UNSET.items():
            text = text.replace(words, flag_words)
    return text
