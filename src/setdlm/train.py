"""``python -m setdlm.train`` (the same command as ``setdlm train``), and the trainer's main names under their
old home: the trainer is the package :mod:`setdlm.training` (docs/training.md)."""

import sys

from .training import (DataOrder, TrainConfig, TrainResult, config_fields, heldout_of,  # noqa: F401
                       interrupted_note, lr_at, prepare_data, resume_config, train)
from .training.cli import add_train_arguments, build_parser, main, run_train  # noqa: F401

if __name__ == "__main__":
    sys.exit(main())
