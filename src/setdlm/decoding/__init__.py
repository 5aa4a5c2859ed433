"""Decoders for every family (docs/method.md §4): ``generate``, ``infill`` and ``fill`` dispatch on
``model.family`` to the AR, MDLM, BD3LM or SetDLM decoder; see ``docs/decoding.md``."""

from .api import fill, generate, infill
from .output import GenerationOutput, StepTrace
from .sampling import Sampling, commit_rule, process_logits, propose
from .settings import DecodeSettings, applicable

__all__ = ["generate", "infill", "fill", "applicable", "DecodeSettings", "GenerationOutput", "StepTrace",
           "Sampling", "commit_rule", "process_logits", "propose"]
