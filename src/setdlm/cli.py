"""The ``setdlm`` command line: thin wrappers over typed library functions.

Every subcommand is registered in ``COMMANDS`` below; ``setdlm --help`` lists them. Bad arguments print a
one-line error naming the bad value and exit with code 2.
"""

from __future__ import annotations

import argparse
import sys


def _schedule(args) -> int:
    """Print the position-offset schedule for (L, D, M): b, k, spacing, expected active tokens."""
    from .schedules import StaggeredSchedule

    s = StaggeredSchedule.from_dm(args.L, args.D, args.M)
    print(f"L={s.L} D={s.D} M={s.M}  b={s.b:.7g}  k={s.k:.7g}  b/spacing={s.b / s.spacing:.6g}  "
          f"expected active tokens C={s.budget:.6g}")
    return 0


def _add_schedule(sub) -> None:
    p = sub.add_parser("schedule", help=_schedule.__doc__.splitlines()[0])
    p.add_argument("--L", type=int, required=True, help="context length")
    p.add_argument("--D", type=int, required=True, help="target parallelism (matched BD3LM block size)")
    p.add_argument("--M", type=int, default=None, help="max set size (default 2D)")
    p.set_defaults(func=_schedule)


COMMANDS = [_add_schedule]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="setdlm", description="Set diffusion language models.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add in COMMANDS:
        add(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except ValueError as e:  # bad user input: one line, exit 2
        print(f"setdlm {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
