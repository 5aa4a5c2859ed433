"""The command line: ``setdlm COMMAND`` parses flags into the library's typed objects, makes one library call
and prints (docs/architecture.md). Nothing in the library imports this package.

* :mod:`~setdlm.cli.commands` — the ``setdlm`` parser and one function per command
* :mod:`~setdlm.cli.flags` — flags derived from the typed settings (decoding, task, model)
* :mod:`~setdlm.cli.options` — the typed options of ``generate`` / ``infill``
* :mod:`~setdlm.cli.train` — ``setdlm train`` / ``python -m setdlm.training``
* :mod:`~setdlm.cli.command` — how a command ends: one-line errors, exit codes
* :mod:`~setdlm.cli.demo` — ``setdlm demo``
* :mod:`~setdlm.cli.chat` — ``setdlm run`` and ``setdlm chat``
* :mod:`~setdlm.cli.listing` — ``setdlm models``
"""

from .commands import main

__all__ = ["main"]
