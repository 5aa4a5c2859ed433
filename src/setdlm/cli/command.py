"""How a command of ``setdlm`` (or ``python -m setdlm.training``) ends: the exit codes of docs/errors.md.

Bad input is a :class:`setdlm.errors.UserError` raised by the library before any work (its field names
printed as flags), a file the machine refuses is an ``OSError``, and an optional extra that is not installed
is an ``ImportError`` naming its ``pip install``: each prints one line
``setdlm COMMAND: error: ...`` and exits with code 2. Any other exception is a bug: Python prints its
traceback (exit code 1). Ctrl-C prints one line saying what is left and exits with code 130 (the shell's
code for SIGINT). Usage errors of the parser (:class:`Parser`) are one line with code 2 as well.
"""

from __future__ import annotations

import argparse
import difflib
import os
import sys
import warnings
from collections.abc import Callable

import torch

from ..errors import InputWarning, UserError, as_flags
from .flags import VALUE_FLAGS, positive_int, value_flag


class Parser(argparse.ArgumentParser):
    """Usage errors as one line (``setdlm train: error: ...``), exit code 2; a value given to a switch whose
    values are flags of their own (``--speculate next_token``) names that flag."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message}{_value_hint(message)}\n")


def add_threads_flag(p: argparse.ArgumentParser) -> None:
    """``--threads N``: the CPU threads PyTorch computes with (``torch.set_num_threads``), what
    ``OMP_NUM_THREADS=N`` sets (README, "Threads": 1 for the shipped models on a busy machine)."""
    p.add_argument("--threads", type=positive_int, default=argparse.SUPPRESS, metavar="N",
                   help="CPU threads PyTorch computes with (default: one per core, or OMP_NUM_THREADS; 1 is fastest "
                        "for the tiny shipped models on a busy machine)")


def set_threads(n: int | None) -> None:
    """``torch.set_num_threads(n)`` when ``n`` is given."""
    if n is not None:
        torch.set_num_threads(n)


def positional_model(name: str | None) -> str | None:
    """``name``, the model argument, unless it is a value of a switch that argparse took as the model
    (``setdlm generate --speculate next_token``, no such folder) or a local path that does not exist (its
    first folder is here, or it starts with ``.``, ``/`` or ``~``: not a Hub id): then a one-line error."""
    if not name or os.path.exists(os.path.expanduser(name)):
        return name
    hint = _value_hint(f"unrecognized arguments: {name}")
    if hint:
        raise UserError(f"{name!r} is not a model{hint.replace(' (', ': ', 1)[:-1]}")
    parent = os.path.dirname(os.path.expanduser(name).rstrip("/"))
    if name.startswith((".", "/", "~")) or (parent and os.path.isdir(name.split("/")[0])):
        near = difflib.get_close_matches(os.path.basename(name.rstrip("/")), sorted(os.listdir(parent or ".")), 1,
                                         0.6) if os.path.isdir(parent or ".") else []
        where = f"; did you mean {os.path.join(parent, near[0])!r}?" if near else ""
        raise UserError(f"checkpoint {name!r} does not exist{where} (a local path, so not a Hub id)")
    return name


def _value_hint(message: str) -> str:
    """``"; ... give --speculate-next-token"`` when ``message`` is argparse's "unrecognized arguments" and one
    of them is a value that has its own flag (:data:`~setdlm.cli.flags.VALUE_FLAGS`)."""
    if not message.startswith("unrecognized arguments:"):
        return ""
    words = message.split(":", 1)[1].split()
    for name, values in VALUE_FLAGS.items():
        for value in values:
            if value in words:
                switch = "--" + name.replace("_", "-")
                return (f" ({switch} is a switch and takes no value; for {name}={value!r} give "
                        f"{value_flag(name, value)})")
    return ""


def _one_line(command: str, message: str) -> int:
    print(f"setdlm {command}: error: {message.splitlines()[0] if message else 'bad input'}", file=sys.stderr)
    return 2


def _warning_line(command: str):
    """A ``warnings.showwarning`` that prints ``setdlm COMMAND: warning: MESSAGE``, one line (no source line)."""
    def show(message, category, filename, lineno, file=None, line=None):
        text = as_flags(message, VALUE_FLAGS) if isinstance(message, InputWarning) else str(message)
        print(f"setdlm {command}: warning: {text.splitlines()[0]}", file=file or sys.stderr)
    return show


def run(command: str, call: Callable[[], int], interrupted: Callable[[KeyboardInterrupt], str]) -> int:
    """``call()``'s exit code, or 2 after a one-line error, or 130 after Ctrl-C with ``interrupted(e)``'s note;
    an exception that is not bad input propagates (its traceback shows). The library's warnings print as
    one line each, ``setdlm COMMAND: warning: ...``."""
    try:
        with warnings.catch_warnings():
            warnings.showwarning = _warning_line(command)
            return call()
    except UserError as e:  # bad user input: one line, exit 2
        return _one_line(command, as_flags(e, VALUE_FLAGS))
    except ImportError as e:  # an optional extra that is not installed says which: one line, exit 2
        if "pip install" not in str(e):
            raise  # a missing module that no extra provides: a bug, with its traceback
        return _one_line(command, str(e))
    except OSError as e:  # the machine refused (a file that cannot be read or written): one line, exit 2
        where = f"{e.filename}: " if e.filename else ""
        return _one_line(command, f"{where}{e.strerror or e}")
    except KeyboardInterrupt as e:  # Ctrl-C: one line, the shell's exit code for SIGINT
        print(f"\nsetdlm {command}: interrupted; {interrupted(e)}", file=sys.stderr)
        return 130
