"""Several processes (started by ``torchrun``; docs/training.md, "Several processes or GPUs"): the process
group, and the two strategies that spread a run over them.

* ``ddp``: every process holds the whole model, optimizer and EMA; gradients are averaged
  (``DistributedDataParallel``). Checkpoints are written by rank 0 in the single-file format.
* ``fsdp``: FSDP2 (``torch.distributed.fsdp.fully_shard``) on every transformer block and on the root, so each
  process holds 1/world of the parameters, gradients, AdamW moments and EMA, and all-gathers a block's
  parameters only while it computes. ``--bf16`` adds a ``MixedPrecisionPolicy`` (bf16 parameters in compute,
  gradients reduced in float32). Checkpoints are sharded (:mod:`setdlm.training.sharded`).

Both run on CPU (gloo) and GPU (nccl). ``batch_size`` is always the global batch; process ``r`` takes
micro-batches ``r·A .. r·A+A−1`` of it (``A`` = ``grad_accum``), seeded by their index in the global batch,
so that the run does not depend on the number of processes beyond float rounding.
"""

from __future__ import annotations

import os
import warnings
from contextlib import nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

import torch
from torch import Tensor, nn

from ..errors import UserError
from ..resources import resolve_device

if TYPE_CHECKING:
    from torch.distributed.fsdp import FSDPModule


@dataclass
class Dist:
    rank: int = 0
    world: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")
    strategy: str = "ddp"

    @property
    def is_main(self) -> bool:
        """Rank 0: the process that prints, logs and names the checkpoint folders."""
        return self.rank == 0

    @property
    def active(self) -> bool:
        return self.world > 1

    @property
    def sharded(self) -> bool:
        return self.strategy == "fsdp"


def init_dist(device: str, strategy: str = "ddp") -> Dist:
    """Read torchrun's environment; initialise the process group when there is more than one process (and
    always under ``fsdp``, which needs one even for a single process)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank, local = int(os.environ.get("RANK", "0")), int(os.environ.get("LOCAL_RANK", "0"))
    if strategy == "fsdp" and "MASTER_ADDR" not in os.environ:
        raise UserError("strategy fsdp shards over the processes of torchrun: start with torchrun "
                        "--nproc-per-node N -m setdlm.training ... (docs/training.md)", fields=("strategy",))
    dev = resolve_device(device, local)
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    if (world > 1 or strategy == "fsdp") and not torch.distributed.is_initialized():
        torch.distributed.init_process_group("nccl" if dev.type == "cuda" else "gloo")
    return Dist(rank, world, local, dev, strategy)


def all_reduce(t: Tensor, dist: Dist, op=None) -> Tensor:
    if dist.active:
        torch.distributed.all_reduce(t, op=op or torch.distributed.ReduceOp.SUM)
    return t


def replica_divergence(model: nn.Module, dist: Dist) -> float | None:
    """Largest |θ_rank − θ_rank0| over all parameters and ranks (0 when training is in sync; None under
    ``fsdp``, which keeps one copy of each parameter)."""
    if dist.sharded:
        return None
    if not dist.active:
        return 0.0
    worst = torch.zeros((), dtype=torch.float64, device=dist.device)
    for p in model.parameters():
        ref = p.detach().clone()
        torch.distributed.broadcast(ref, 0)
        worst = torch.maximum(worst, (p.detach() - ref).abs().max().double())
    return float(all_reduce(worst, dist, torch.distributed.ReduceOp.MAX))


def blocks(backbone: nn.Module) -> nn.ModuleList:
    """The transformer blocks FSDP shards one by one: the DiT's ``blocks``, or the first ``nn.ModuleList`` of
    a Hugging Face backbone (its decoder layers)."""
    found = getattr(backbone, "blocks", None)
    if isinstance(found, nn.ModuleList):
        return found
    found = next((m for m in backbone.modules() if isinstance(m, nn.ModuleList)), None)
    if found is None:
        raise UserError(f"strategy fsdp: no list of transformer blocks in {type(backbone).__name__}")
    return found


def wrap(backbone: nn.Module, dist: Dist, bf16: bool) -> nn.Module:
    """The module the training step calls: ``backbone`` under DDP (several processes), sharded in place by
    FSDP2 (``fsdp``: then ``backbone`` itself), or ``backbone`` alone."""
    if dist.sharded:
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard  # FSDP runs only

        # the DiT returns its logits as a view; nothing changes them in place (the losses read them), which
        # is what FSDP2's warning about views is for (tests/test_train_fsdp.py: the gradients are exact)
        warnings.filterwarnings("ignore", message="FSDP2-wrapped module .* returned a view tensor")
        policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if bf16 else \
            MixedPrecisionPolicy()
        for block in blocks(backbone):
            fully_shard(block, mp_policy=policy)
        fully_shard(backbone, mp_policy=policy)
        return backbone
    if dist.active:
        ids = [dist.device.index] if dist.device.type == "cuda" else None
        return nn.parallel.DistributedDataParallel(backbone, device_ids=ids)
    return backbone


def gradient_sync(net: nn.Module, dist: Dist, last: bool):
    """Context of one micro-batch's backward: gradients are reduced across processes only at the last one."""
    if not dist.active or last:
        if dist.sharded:  # fully_shard made the module an FSDPModule
            cast("FSDPModule", net).set_requires_gradient_sync(True)
        return nullcontext()
    if dist.sharded:
        cast("FSDPModule", net).set_requires_gradient_sync(False)
        return nullcontext()
    return cast(nn.parallel.DistributedDataParallel, net).no_sync()


def local(t):
    """A plain tensor: the full value of a DTensor (a sharded parameter, a norm over shards), else ``t``."""
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def grad_norm(params: list[nn.Parameter], clip: float) -> Tensor:
    """The global gradient norm (a 0-dim tensor on the gradients' device: reading it is left to the caller, so
    the step needs no host sync here), after clipping the gradients to ``clip`` (0 = no clipping)."""
    if clip > 0:
        return local(torch.nn.utils.clip_grad_norm_(params, clip))
    grads = [p.grad for p in params if p.grad is not None]
    if grads and hasattr(grads[0], "full_tensor"):
        return local(torch.nn.utils.get_total_norm(grads))
    return torch.linalg.vector_norm(torch.stack([g.norm() for g in grads]))
