"""setdlm: set diffusion language models (SetDLM) and their special cases AR, MDLM and BD3LM."""

from .loading import load
from .family import FAMILIES, FamilyConfig
from .lm import Model
from .model import KVCache, ModelConfig, Transformer
from .batch import Batch
from .objectives import LossOutput, compute_loss
from .schedules import LinearSchedule, StaggeredSchedule

__version__ = "0.1.0"

__all__ = ["FAMILIES", "FamilyConfig", "Model", "KVCache", "ModelConfig", "Transformer", "Batch", "LossOutput",
           "compute_loss", "LinearSchedule", "StaggeredSchedule", "load", "__version__"]
