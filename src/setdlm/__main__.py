"""``python -m setdlm``: the same as the ``setdlm`` command."""

import sys

from .cli import main

sys.exit(main())
