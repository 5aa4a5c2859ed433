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
import sys
import warnings
from collections.abc import Callable

from ..errors import InputWarning, UserError, as_flags
from .flags import VALUE_FLAGS


class Parser(argparse.ArgumentParser):
    """Usage errors as one line (``setdlm train: error: ...``), exit code 2."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message}\n")


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
