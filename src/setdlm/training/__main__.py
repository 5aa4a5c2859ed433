"""``python -m setdlm.training`` (and ``torchrun ... -m setdlm.training``): the same command as ``setdlm train``."""

import sys

from ..cli.train import main

sys.exit(main())
