"""setdlm: set diffusion language models (SetDLM) and their special cases AR, MDLM and BD3LM.

The public names are those of ``__all__`` here and in the subpackages ``setdlm.data``, ``setdlm.decoding``
and ``setdlm.serve``, plus the documented functions of the modules the docs name (``setdlm.evaluation`` and its modules,
``setdlm.training``, ...).
"""

from .backbone import Backbone
from .formats.loading import load
from .family import FAMILIES, FamilyConfig
from .lm import Model
from .model import KVCache, Transformer, TransformerConfig
from .batch import Batch
from .objectives import LossOutput, compute_loss
from .schedules import LinearSchedule, StaggeredSchedule

__version__ = "0.1.0"

__all__ = ["FAMILIES", "FamilyConfig", "Model", "Backbone", "KVCache", "Transformer", "TransformerConfig", "Batch",
           "LossOutput", "compute_loss", "LinearSchedule", "StaggeredSchedule", "load", "__version__"]
