"""The trainable state of one process (docs/method.md §9.6): the backbone wrapped for the strategy, AdamW,
the EMA weights and the step; one optimizer step, the held-out evaluation, and the checkpoint of it all."""

from __future__ import annotations

import contextlib
from contextlib import nullcontext
from pathlib import Path
from typing import cast

import torch
from torch import Tensor, nn

from ..backbone import Backbone
from ..formats import checkpoint as ckpt
from ..formats import backbones, layout, optim_state, safety
from ..evaluation.likelihood import likelihood
from ..lm import Model
from ..model import Transformer
from ..objectives import compute_loss
from ..outputs import write_text_atomic
from .config import TrainConfig
from .data import Setup, check_same_data, data_digest
from .distributed import Dist, grad_norm, gradient_sync, replica_divergence, wrap
from .schedule import DataOrder, lr_at, micro_batch_seed
from .sharded import is_sharded, load_sharded, save_sharded


class TrainState:
    """Backbone, optimizer, EMA and step of one run in one process."""

    def __init__(self, cfg: TrainConfig, dist: Dist, setup: Setup, resume_from: Path | None,
                 init: nn.Module | None = None):
        """``init``: the starting backbone (``init_from``, or the checkpoint ``resume_from``), else a fresh DiT;
        ``resume_from`` also restores the optimizer, step and EMA."""
        self.cfg, self.dist, self.setup = cfg, dist, setup
        torch.manual_seed(cfg.optim.seed)  # identical initial weights in every process
        backbone = init if init is not None else Transformer(cfg.model_config(setup.tokenizer.vocab_size))
        self.backbone = backbone.to(dist.device).train()
        # same gradients, less activation memory (nn.Module.__setattr__ is typed for tensors and submodules only)
        self.backbone.grad_checkpointing = cfg.system.grad_checkpointing  # type: ignore[assignment]
        names = list(backbones.unique_state_dict(self.backbone))  # before sharding: tied weights once
        net = wrap(self.backbone, dist, cfg.system.bf16)  # under fsdp the backbone itself, sharded in place
        o = cfg.optim
        fused = dist.device.type == "cuda" and not dist.sharded  # one kernel for the whole update on a GPU
        self.optimizer = torch.optim.AdamW(self.backbone.parameters(), lr=o.lr, betas=(o.beta1, o.beta2), eps=1e-8,
                                           weight_decay=o.weight_decay, fused=fused or None)
        self.step = 0
        self.ema: dict[str, Tensor] | None = None
        if o.ema:
            sd = self.backbone.state_dict()
            self.ema = {k: sd[k].detach().clone().float() for k in names}
        if resume_from is not None:
            self._restore(resume_from, net)
        # torch.compile of a module is a module (an OptimizedModule); torch types it as any callable's wrapper
        self.net = cast(nn.Module, torch.compile(net)) if cfg.system.compile else net
        self.order = DataOrder(len(setup.train_rows), o.seed)
        self.micro = o.batch_size // (o.grad_accum * dist.world)
        self.digest: str | None = None  # data_digest, computed at the first checkpoint

    def _restore(self, folder: Path, net: nn.Module) -> None:
        if is_sharded(folder):
            state, opt = layout.read_json(folder / layout.STATE, "the checkpoint cannot resume training"), None
            load_sharded(folder, net, self.optimizer, self.ema)
        else:
            state, opt = optim_state.load_training_state(folder)
        check_same_data(folder, state.get("data_sha256"), self.setup, self.cfg.checkpointing.allow_data_change)
        if opt is not None:
            self.optimizer.load_state_dict(opt)
        self.step = int(state["step"])
        if self.ema is not None and not is_sharded(folder):
            expected = backbones.expected_shapes(self.backbone)
            ema = safety.read_tensors(folder / layout.EMA_WEIGHTS, expected, " (the run was configured with EMA)")
            self.ema = {k: v.float().to(self.dist.device) for k, v in ema.items()}

    def train_step(self) -> tuple[float, float, int]:
        """One optimizer step. Returns (mean loss over this process's micro-batches, grad norm, tokens seen by
        this process)."""
        o, dist, s = self.cfg.optim, self.dist, self.step
        for g in self.optimizer.param_groups:
            g["lr"] = lr_at(o, s)
        rows = self.order.batch(s, o.batch_size)  # (G,) global batch
        per_rank = o.batch_size // dist.world
        mine = rows[dist.rank * per_rank:(dist.rank + 1) * per_rank]
        self.optimizer.zero_grad(set_to_none=True)
        loss_sum, tokens = torch.zeros((), dtype=torch.float64, device=dist.device), 0
        amp = torch.autocast(dist.device.type, dtype=torch.bfloat16) if self.cfg.system.bf16 else nullcontext()
        for m in range(o.grad_accum):
            batch = self.setup.train_rows.batch(mine[m * self.micro:(m + 1) * self.micro])
            tokens += int(batch.attention_mask.sum())  # counted on the host, before the copy: no device sync
            batch = batch.to(dist.device)
            seed = micro_batch_seed(o.seed, s, dist.rank * o.grad_accum + m)
            torch.manual_seed(seed)  # dropout
            gen = torch.Generator(dist.device).manual_seed(seed)
            with gradient_sync(self.backbone if dist.sharded else self.net, dist, m == o.grad_accum - 1):
                with amp:
                    out = compute_loss(cast(Backbone, self.net), self.setup.family, batch, train=True, generator=gen)
                (out.loss / o.grad_accum).backward()
            loss_sum += out.loss.detach()
        norm = grad_norm(list(self.backbone.parameters()), o.clip)  # a tensor: read after the update is queued
        self.optimizer.step()
        if self.ema is not None:
            with torch.no_grad():
                sd = self.backbone.state_dict()
                torch._foreach_lerp_(list(self.ema.values()), [sd[k].float() for k in self.ema], 1.0 - o.ema)
        self.step += 1
        loss, norm = torch.stack([loss_sum, norm.double()]).tolist()  # the step's one host sync
        return loss / o.grad_accum, norm, tokens

    @contextlib.contextmanager
    def _ema_weights(self):
        """The EMA weights in the backbone's parameters for the duration (cast to their dtype), then the raw
        ones back."""
        sd = self.backbone.state_dict()
        raw = {k: sd[k].detach().clone() for k in self.ema}
        with torch.no_grad():
            for k, v in self.ema.items():
                sd[k].copy_(v)
        try:
            yield
        finally:
            with torch.no_grad():
                for k, v in raw.items():
                    sd[k].copy_(v)

    def evaluate(self) -> dict:
        """The held-out bound (docs/method.md §5.1) as the metrics row's fields. Under ``ddp`` the processes
        share the batches; under ``fsdp`` (whose forward is collective) each process scores all of them."""
        e = self.cfg.evaluation
        with self._ema_weights() if e.eval_ema else nullcontext():
            batches = self.setup.heldout_rows.batches(e.eval_batch_size)
            res = likelihood(Model(self.backbone, self.setup.family), batches,
                             seed=e.eval_seed, bf16=self.cfg.system.bf16, progress=False,
                             dist=None if self.dist.sharded else self.dist)
        return res.bound_row()

    def save(self, out: Path, last: dict) -> Path:
        """Write checkpoint ``out/checkpoints/step-N`` and point ``out/latest`` at it (collective)."""
        cfg, dist = self.cfg, self.dist
        divergence = replica_divergence(self.backbone, dist)
        name = f"checkpoints/step-{self.step:08d}"
        self.digest = self.digest or (data_digest(self.setup) if dist.is_main else None)
        state = {"step": self.step, "data": self.order.position(self.step, cfg.optim.batch_size),
                 "data_sha256": self.digest, "world_size": dist.world, "strategy": dist.strategy,
                 "lr_schedule": {"kind": cfg.optim.lr_schedule, "lr": lr_at(cfg.optim, max(self.step - 1, 0))},
                 "rng": "derived from (seed, step, micro-batch); nothing to restore", "last": last}
        model = Model(self.backbone, self.setup.family, self.setup.tokenizer)
        if dist.sharded:
            save_sharded(out / name, model, self.backbone, self.optimizer, self.ema, cfg.to_dict(), state, dist)
        elif dist.is_main:
            state["replica_max_abs_diff"] = divergence
            ckpt.save(out / name, model, ema=self.ema, training_args=cfg.to_dict(), training_state=state,
                      optimizer_state=self.optimizer.state_dict())
        if dist.is_main:
            write_text_atomic(out / layout.LATEST, name + "\n")
        if dist.active and not dist.sharded:
            torch.distributed.barrier()
        return out / name
