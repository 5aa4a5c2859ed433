"""``setdlm models``: the shipped models, then the packaged GGUF models installed (and the pip line of those
that are not)."""

from __future__ import annotations

import sys

from ..errors import UserError
from ..formats import gguf, pretrained


def list_models(args) -> int:
    """List the models shipped inside the package: name, parameters, size, family, context and task; then the
    packaged GGUF models that are installed."""
    print(pretrained.table())
    installed, missing = _packaged_models()
    if installed:
        print("\npackaged GGUF models, installed (setdlm generate NAME, setdlm.load(NAME)):")
        print("\n".join(installed))
    also = [*missing, "any setdlm checkpoint folder, GGUF file or Hub id"]
    print(f"also: {', '.join(also)}", file=sys.stderr)
    return 0


def _packaged_models() -> tuple[list[str], list[str]]:
    """(a line per packaged GGUF model whose package is installed, ``NAME (pip line)`` per one that is not)."""
    installed, missing = [], []
    for name, (package, file, pip_line) in gguf.PACKAGED.items():
        try:
            path = gguf.packaged_file(name)
        except UserError:
            missing.append(f"{name} ({pip_line})")
            continue
        converted = sorted((gguf.cache_root() / "gguf").glob(f"{path.stem}-*-v{gguf.CONVERTER_VERSION}"))
        state = (f"converted: {converted[0]}" if converted else
                 f"converted once, on first use, into {gguf.cache_root() / 'gguf'}")
        installed.append(f"{name}  {file} ({path.stat().st_size / 2**20:.0f} MiB, {package.replace('_', '-')}), "
                         f"{state}")
    return installed, missing
