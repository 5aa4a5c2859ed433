"""How a command of ``setdlm`` (or ``python -m setdlm.train``) ends: the exit codes of docs/errors.md.

Bad input is a ``ValueError``/``TypeError`` raised by the library before any work, and a file the machine
refuses is an ``OSError``: either prints one line ``setdlm COMMAND: error: ...`` and exits with code 2.
Ctrl-C prints one line saying what is left and exits with code 130 (the shell's code for SIGINT). Usage
errors of the parser (:class:`Parser`) are one line with code 2 as well.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable


class Parser(argparse.ArgumentParser):
    """Usage errors as one line (``setdlm train: error: ...``), exit code 2."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message}\n")


def run(command: str, call: Callable[[], int], interrupted: Callable[[KeyboardInterrupt], str]) -> int:
    """``call()``'s exit code, or 2 after a one-line error, or 130 after Ctrl-C with ``interrupted(e)``'s note."""
    try:
        return call()
    except (ValueError, TypeError) as e:  # bad user input: one line, exit 2
        print(f"setdlm {command}: error: {str(e).splitlines()[0] if str(e) else type(e).__name__}",
              file=sys.stderr)
        return 2
    except OSError as e:  # the machine refused (a file that cannot be read or written): one line, exit 2
        where = f"{e.filename}: " if e.filename else ""
        print(f"setdlm {command}: error: {where}{e.strerror or e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as e:  # Ctrl-C: one line, the shell's exit code for SIGINT
        print(f"\nsetdlm {command}: interrupted; {interrupted(e)}", file=sys.stderr)
        return 130
