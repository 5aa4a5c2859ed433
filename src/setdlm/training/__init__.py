"""Training, as a recipe over small components (docs/training.md, "The training package"):

* :mod:`~setdlm.training.config`: the run's configuration, seven groups each checked on its own;
* :mod:`~setdlm.training.schedule`: learning rate, data order and per-step seeds (functions of the step);
* :mod:`~setdlm.training.data`: the data recipe (corpus → tokenizer → rows → held-out split);
* :mod:`~setdlm.training.run_folder`: the run folder's lock, log, resume configuration;
* :mod:`~setdlm.training.memory`: the memory check before anything is allocated;
* :mod:`~setdlm.training.distributed`: several processes, DDP or FSDP2;
* :mod:`~setdlm.training.sharded`: FSDP2's sharded checkpoints, and their conversion to one file;
* :mod:`~setdlm.training.state`: model, optimizer, EMA and one optimizer step;
* :mod:`~setdlm.training.loop`: setup → train → save → cleanup (:func:`train`);
* :mod:`~setdlm.cli.train`: ``setdlm train`` / ``python -m setdlm.training``.
"""

from .config import (CheckpointArgs, CorpusArgs, EvalArgs, ObjectiveArgs, ModelArgs, OptimArgs, SystemArgs, TrainConfig,
                     config_fields, knobs_for)
from .data import Setup, heldout_of, prepare_data
from .loop import TrainResult, train
from .run_folder import interrupted_note, resume_config
from .schedule import DataOrder, lr_at
from .sharded import consolidate

__all__ = ["CheckpointArgs", "CorpusArgs", "DataOrder", "EvalArgs", "ObjectiveArgs", "ModelArgs", "OptimArgs", "Setup",
           "SystemArgs", "TrainConfig", "TrainResult", "config_fields", "consolidate", "heldout_of",
           "interrupted_note", "knobs_for", "lr_at", "prepare_data", "resume_config", "train"]
