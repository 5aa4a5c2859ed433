"""The memory check before training (docs/training.md): refuse sizes that cannot fit before allocating."""

from __future__ import annotations

import torch
from torch import nn

from ..model import Transformer
from ..resources import check_fits
from .config import TrainConfig, streams


def check_memory(cfg: TrainConfig, backbone: nn.Module | None, vocab_size: int, device: torch.device,
                 world: int) -> None:
    """Refuse sizes that cannot fit before allocating anything: a lower bound of parameters, gradients
    and AdamW moments (16 bytes per parameter in float32, + 4 with EMA) and of the activations kept for the
    backward pass (at least 4 floats of width d per position, layer and row of a micro-batch; SetDLM and
    BD3LM see 2L positions per row, the clean and the noisy stream). Under ``fsdp`` each process holds
    1/world of the parameters, gradients and moments."""
    if backbone is None:
        with torch.device("meta"):
            backbone = Transformer(cfg.model_config(vocab_size))
    n_params = sum(p.numel() for p in backbone.parameters())
    d = getattr(getattr(backbone, "config", None), "hidden_size", cfg.model.hidden_size)
    layers = getattr(getattr(backbone, "config", None), "n_layers", cfg.model.n_layers)
    rows = cfg.optim.batch_size // (cfg.optim.grad_accum * world)
    shards = world if cfg.system.strategy == "fsdp" else 1
    state = n_params * (20 if cfg.optim.ema else 16) // shards
    needed = state + rows * streams(cfg.objective.family) * cfg.corpus.length * layers * d * 4 * 4
    check_fits(f"training {n_params:,} parameters on micro-batches of {rows} rows", needed, device,
               "lower hidden_size / n_layers, or batch_size (or raise grad_accum)",
               fields=("hidden_size", "n_layers", "batch_size", "grad_accum"))
