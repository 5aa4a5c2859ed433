"""``python -m setdlm.training.export CHECKPOINT_OR_RUN...``: convert an FSDP run's sharded checkpoints to
the single-file weights that ``setdlm.load`` reads (:func:`setdlm.training.sharded.consolidate`)."""

from __future__ import annotations

import sys

from .sharded import consolidate


def main(argv: list[str] | None = None) -> int:
    from ..command import run

    folders = sys.argv[1:] if argv is None else argv
    if not folders:
        print("usage: python -m setdlm.training.export CHECKPOINT_OR_RUN_FOLDER...", file=sys.stderr)
        return 2

    def convert() -> int:
        for f in folders:
            print(consolidate(f))
        return 0

    return run("export", convert, lambda e: "a file being written is left under a temporary name")


if __name__ == "__main__":
    sys.exit(main())
