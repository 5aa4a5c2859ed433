"""The training loop (SPEC.md §2.1, §2.9, §5.1; DESIGN.md §6): ``setdlm train`` / ``python -m setdlm.train``.

AdamW with linear warm-up then a constant or cosine learning rate, gradient clipping, EMA weights,
gradient accumulation, opt-in bf16 autocast and ``torch.compile``, periodic evaluation of the held-out
bound (:func:`likelihood`), tqdm progress and a JSONL metrics log, checkpoints (:mod:`setdlm.checkpoint`)
and ``--resume``. ``--init-from`` starts from existing weights instead of a random DiT (:func:`load_init`):
a setdlm checkpoint of any family (e.g. AR → SetDLM adaptation) or a Hugging Face causal LM (SPEC §2.9). Started by ``torchrun --nproc_per_node=N`` the same command trains data-parallel (DDP;
gloo on CPU, nccl on GPU); ``batch_size`` is always the *global* batch.

Reproducibility and exact resume: nothing random is carried from step to step. The data order of epoch
``e`` is a permutation seeded by ``(seed, e)``, and the randomness of step ``s`` (orders, masks, dropout)
is seeded by ``(seed, s, rank, micro-batch)``; the learning rate is a function of ``s``. A checkpoint thus
only needs the weights, the EMA, the optimizer moments and ``s``: a run killed with SIGKILL and resumed
produces bitwise the same weights as an uninterrupted one.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import math
import os
import shutil
import sys
import time
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import torch
from torch import Tensor, nn
from tqdm.auto import tqdm

from . import checkpoint as ckpt
from .data import TokenDataset, Tokenizer, build_dataset, build_tokenizer, heldout_split, read_source
from .family import FAMILIES, FamilyConfig
from .lm import Model
from .model import ModelConfig, Transformer
from .objectives import compute_loss
from .presets import preset as preset_values

METRICS = "metrics.jsonl"


def _f(help: str, **kw):
    return field(metadata={"help": help}, **kw)


@dataclass
class TrainConfig:
    """Every training argument. Defaults are the ``tiny`` preset; see :mod:`setdlm.presets`."""

    out: str = _f("run folder: checkpoints, metrics.jsonl")
    data: str = _f("training text: a file, folder, .jsonl, built-in corpus or hf:NAME", default="shakespeare")
    family: str = _f("ar, mdlm, bd3lm or setdlm", default="setdlm")
    preset: str = _f("preset the other defaults came from", default="tiny")
    init_from: str | None = _f("start from these weights (architecture and tokenizer included): a setdlm checkpoint "
                               "or run folder, a Hugging Face causal LM folder, or a Hub id", default=None)
    D: int = _f("setdlm: target parallelism D", default=4)
    M: int | None = _f("setdlm: max set size M (default 2D, capped at L)", default=None)
    k: float | None = _f("setdlm: explicit schedule shape k (default from D, M)", default=None)
    block_size: int | None = _f("bd3lm: block size S (default D); mdlm: decoding sub-block", default=None)
    tokenizer: str = _f("bpe, char, a tokenizer folder, or hf:NAME (Hub)", default="char")
    vocab_size: int = _f("BPE vocabulary size (special tokens included)", default=4096)
    length: int = _f("context length L", default=64)
    hidden_size: int = _f("model width d", default=64)
    n_layers: int = _f("transformer layers", default=2)
    n_heads: int = _f("attention heads", default=2)
    dropout: float = _f("residual dropout", default=0.0)
    steps: int = _f("optimizer steps in total", default=200)
    batch_size: int = _f("global batch (rows per optimizer step, all processes together)", default=16)
    grad_accum: int = _f("micro-batches per optimizer step", default=1)
    lr: float = _f("peak learning rate", default=1e-3)
    warmup: int = _f("linear warm-up steps", default=20)
    lr_schedule: str = _f("after warm-up: constant or cosine", default="constant")
    min_lr_ratio: float = _f("cosine: final learning rate / peak", default=0.1)
    weight_decay: float = _f("AdamW weight decay", default=0.0)
    beta1: float = _f("AdamW beta1", default=0.9)
    beta2: float = _f("AdamW beta2", default=0.999)
    clip: float = _f("gradient clipping norm (0 = off)", default=1.0)
    ema: float = _f("EMA decay per step (0 = no EMA)", default=0.0)
    eval_ema: bool = _f("evaluate the EMA weights instead of the raw ones", default=False)
    eval_every: int = _f("evaluate the held-out bound every N steps (0 = only at the end)", default=100)
    eval_fraction: float = _f("share of rows held out", default=0.05)
    eval_max: int = _f("at most this many held-out rows", default=256)
    eval_batch_size: int = _f("rows per evaluation batch", default=16)
    eval_seed: int = _f("seed of the evaluation's random orders/masks (SPEC §5.1 uses 1)", default=1)
    split_seed: int = _f("seed of the fixed held-out split", default=0)
    save_every: int = _f("checkpoint every N steps (0 = only at the end)", default=100)
    keep: int = _f("checkpoints kept", default=2)
    log_every: int = _f("log training metrics every N steps", default=10)
    seed: int = _f("seed of initialisation, data order and training randomness", default=0)
    bf16: bool = _f("bf16 autocast", default=False)
    grad_checkpointing: bool = _f("recompute each layer's activations in the backward pass (less memory, "
                                  "about one more forward of compute)", default=False)
    compile: bool = _f("torch.compile the backbone", default=False)
    device: str = _f("auto, cpu, cuda or cuda:N", default="auto")
    resume: bool = _f("continue from the run folder's latest checkpoint", default=False)

    # fields that may change when resuming a run
    RESUMABLE = ("steps", "eval_every", "save_every", "keep", "log_every", "resume", "device", "compile", "out",
                 "grad_checkpointing")

    def __post_init__(self):
        positive = ("vocab_size", "length", "hidden_size", "n_layers", "n_heads", "steps", "batch_size",
                    "grad_accum", "eval_batch_size", "keep", "log_every", "D", "M", "block_size")
        non_negative = ("warmup", "eval_every", "save_every", "eval_max", "seed", "eval_seed", "split_seed")
        for names, lo, what in ((positive, 1, "a positive"), (non_negative, 0, "a non-negative")):
            for name in names:
                v = getattr(self, name)
                if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < lo):
                    raise ValueError(f"{name} must be {what} integer, got {v!r}")
        if not self.out:
            raise ValueError("out (the run folder) is required")
        if Path(self.data).exists():  # recorded absolute, so that `setdlm eval` finds it from anywhere
            self.data = str(Path(self.data).resolve())
        if self.family not in FAMILIES:
            raise ValueError(f"unknown family {self.family!r}; choose one of {', '.join(FAMILIES)}")
        if not (self.lr > 0 and math.isfinite(self.lr)):
            raise ValueError(f"lr must be positive, got {self.lr}")
        if self.lr_schedule not in ("constant", "cosine"):
            raise ValueError(f"lr_schedule must be constant or cosine, got {self.lr_schedule!r}")
        checks = (("min_lr_ratio", 0 <= self.min_lr_ratio <= 1), ("weight_decay", self.weight_decay >= 0),
                  ("beta1", 0 <= self.beta1 < 1), ("beta2", 0 <= self.beta2 < 1), ("clip", self.clip >= 0),
                  ("ema", 0 <= self.ema < 1), ("dropout", 0 <= self.dropout < 1),
                  ("eval_fraction", 0 < self.eval_fraction < 1))
        for name, ok in checks:
            if not ok:
                raise ValueError(f"{name} out of range: {getattr(self, name)}")
        if self.batch_size % self.grad_accum:
            raise ValueError(f"batch_size {self.batch_size} is not divisible by grad_accum {self.grad_accum}")
        if self.hidden_size % self.n_heads:
            raise ValueError(f"hidden_size {self.hidden_size} is not divisible by n_heads {self.n_heads}")
        if self.eval_ema and not self.ema:
            raise ValueError("eval_ema needs EMA weights: set ema > 0 (e.g. 0.999)")
        self.family_config(mask_token_id=0)  # validates D, M, k, block size against L

    @classmethod
    def from_preset(cls, name: str = "tiny", **overrides) -> "TrainConfig":
        return cls(**{**preset_values(name), **overrides, "preset": name})

    def to_dict(self) -> dict:
        return asdict(self)

    def family_config(self, mask_token_id: int) -> FamilyConfig:
        f = self.family
        return FamilyConfig(f, length=self.length, mask_token_id=mask_token_id,
                            block_size=self.block_size if f == "mdlm" else (self.block_size or self.D) if f == "bd3lm" else None,
                            D=self.D if f == "setdlm" else None, M=self.M if f == "setdlm" else None,
                            k=self.k if f == "setdlm" else None)

    def model_config(self, vocab_size: int) -> ModelConfig:
        return ModelConfig(vocab_size=vocab_size, hidden_size=self.hidden_size, n_heads=self.n_heads,
                           n_layers=self.n_layers, dropout=self.dropout)


def config_fields() -> tuple[dataclasses.Field, ...]:
    return fields(TrainConfig)


# ---------------------------------------------------------------------------------------------------------
# seeds, learning rate, data order
# ---------------------------------------------------------------------------------------------------------


def derive_seed(*parts) -> int:
    """A 63-bit seed from any tuple of ints/strings, identical in every process."""
    return int.from_bytes(hashlib.sha256(repr(parts).encode()).digest()[:8], "little") & (2**63 - 1)


def lr_at(cfg: TrainConfig, step: int) -> float:
    """Learning rate of optimizer step ``step`` (0-based): linear warm-up, then constant or cosine."""
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    if cfg.lr_schedule == "constant":
        return cfg.lr
    span = max(cfg.steps - cfg.warmup, 1)
    progress = min((step - cfg.warmup) / span, 1.0)
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


class DataOrder:
    """Global batch ``s`` = rows ``s·G .. s·G+G−1`` of an endless stream of epochs, each a permutation of the
    training rows seeded by ``(seed, epoch)``: a pure function of ``s``."""

    def __init__(self, n: int, seed: int):
        self.n, self.seed = n, seed
        self._perms: dict[int, Tensor] = {}

    def perm(self, epoch: int) -> Tensor:
        if epoch not in self._perms:
            if len(self._perms) > 4:
                self._perms.clear()
            g = torch.Generator().manual_seed(derive_seed(self.seed, "data", epoch))
            self._perms[epoch] = torch.randperm(self.n, generator=g)
        return self._perms[epoch]

    def batch(self, step: int, size: int) -> Tensor:
        pos = torch.arange(step * size, (step + 1) * size)
        epochs = pos // self.n
        return torch.cat([self.perm(int(e))[pos[epochs == e] % self.n] for e in epochs.unique()])

    def position(self, step: int, size: int) -> dict:
        done = step * size
        return {"epoch": done // self.n, "offset": done % self.n, "rows_seen": done}


# ---------------------------------------------------------------------------------------------------------
# distributed
# ---------------------------------------------------------------------------------------------------------


@dataclass
class Dist:
    rank: int = 0
    world: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")

    @property
    def main(self) -> bool:
        return self.rank == 0

    @property
    def active(self) -> bool:
        return self.world > 1


def init_dist(device: str) -> Dist:
    """Read torchrun's environment; initialise the process group when there is more than one process."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank, local = int(os.environ.get("RANK", "0")), int(os.environ.get("LOCAL_RANK", "0"))
    if device == "auto":
        device = f"cuda:{local}" if torch.cuda.is_available() else "cpu"
    elif device == "cuda":
        device = f"cuda:{local}"
    try:
        dev = torch.device(device)
    except RuntimeError:
        raise ValueError(f"unknown device {device!r}") from None
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    if world > 1 and not torch.distributed.is_initialized():
        torch.distributed.init_process_group("nccl" if dev.type == "cuda" else "gloo")
    return Dist(rank, world, local, dev)


def _all_reduce(t: Tensor, dist: Dist, op=None) -> Tensor:
    if dist.active:
        torch.distributed.all_reduce(t, op=op or torch.distributed.ReduceOp.SUM)
    return t


def replica_divergence(model: nn.Module, dist: Dist) -> float:
    """Largest |θ_rank − θ_rank0| over all parameters and ranks (0 when training is in sync)."""
    if not dist.active:
        return 0.0
    worst = torch.zeros((), dtype=torch.float64, device=dist.device)
    for p in model.parameters():
        ref = p.detach().clone()
        torch.distributed.broadcast(ref, 0)
        worst = torch.maximum(worst, (p.detach() - ref).abs().max().double())
    return float(_all_reduce(worst, dist, torch.distributed.ReduceOp.MAX))


# ---------------------------------------------------------------------------------------------------------
# evaluation of the held-out bound (SPEC §5.1)
# ---------------------------------------------------------------------------------------------------------


def likelihood(backbone: nn.Module, family: FamilyConfig, data: TokenDataset, *, batch_size: int = 16,
               seed: int = 1, bf16: bool = False, device=None, dist: Dist | None = None,
               progress: bool = False) -> dict:
    """The family's likelihood bound over ``data`` (SPEC §5.1): ``nelbo = Σ nll / Σ tokens`` (nats per
    token; exact NLL for AR, one sampled order per row for SetDLM, 1/t-weighted for MDLM/BD3LM), ``ppl``,
    ``bpd``, ``tokens``, and ``loss`` (mean of per-batch bounds). Batch ``i`` draws its randomness from a
    generator seeded by ``(seed, i)``, so the result does not depend on the number of processes."""
    dist = dist or Dist(device=torch.device(device or "cpu"))
    device = dist.device if device is None else torch.device(device)
    if len(data) == 0:
        raise ValueError("no rows to evaluate")
    was_training = backbone.training
    backbone.eval()
    sums = torch.zeros(3, dtype=torch.float64, device=device)  # nll, tokens, Σ batch losses
    starts = list(range(0, len(data), batch_size))
    amp = torch.autocast(device.type, dtype=torch.bfloat16) if bf16 else nullcontext()
    with torch.no_grad(), amp:
        for i in tqdm(range(dist.rank, len(starts), dist.world), disable=None if progress else True, desc="eval",
                      leave=False):
            batch = data.batch(torch.arange(starts[i], min(starts[i] + batch_size, len(data)))).to(device)
            gen = torch.Generator(device).manual_seed(derive_seed(seed, "eval", i))
            out = compute_loss(backbone, family, batch, train=False, generator=gen)
            sums += torch.stack([out.nll.double().sum(), out.mask.sum().double(), out.loss.double()])
    backbone.train(was_training)
    nll, tokens, loss_sum = _all_reduce(sums, dist).tolist()
    nelbo = nll / max(tokens, 1)
    return {"nelbo": nelbo, "ppl": math.exp(min(nelbo, 700)), "bpd": nelbo / math.log(2), "tokens": int(tokens),
            "loss": loss_sum / len(starts)}


# ---------------------------------------------------------------------------------------------------------
# setup
# ---------------------------------------------------------------------------------------------------------


def load_init(name_or_path: str) -> tuple[nn.Module, Tokenizer]:
    """``(backbone, tokenizer)`` that ``--init-from`` names: a setdlm checkpoint or run folder (any family,
    DiT or HF backbone; also a folder in the paper authors' layout), or a ``transformers`` causal LM (Llama,
    Qwen2/3, GPT-2; a local folder, or a Hub id, which needs network), given a MASK token when its
    tokenizer has none. Weights in float32, in training mode."""
    from .convert import is_reference_folder
    from .hub import is_hub_id

    from .gguf import PACKAGED

    p = Path(name_or_path).expanduser()
    if not p.exists() and not is_hub_id(name_or_path) and name_or_path not in PACKAGED:
        raise ValueError(f"--init-from {name_or_path!r}: no such folder (and not a Hub id)")
    folder = ckpt.locate(name_or_path)
    if ckpt.is_checkpoint(folder) or is_reference_folder(folder):
        model = ckpt.load(folder, dtype=torch.float32)
        if not isinstance(model.tokenizer, Tokenizer):
            raise ValueError(f"--init-from {name_or_path!r}: no tokenizer found with the weights")
        return model.backbone.train(), model.tokenizer
    from .hf import load_pretrained, setdlm_tokenizer

    backbone, tok, _ = load_pretrained(str(folder) if p.exists() else name_or_path, dtype=torch.float32)
    return backbone.train(), setdlm_tokenizer(tok.hf)


def _with_init_architecture(cfg: TrainConfig, backbone: nn.Module) -> TrainConfig:
    """Record the DiT architecture that ``--init-from`` brought (it replaces the preset's)."""
    if not isinstance(backbone, Transformer):
        return cfg
    c = backbone.config
    return dataclasses.replace(cfg, hidden_size=c.hidden_size, n_layers=c.n_layers, n_heads=c.n_heads,
                               dropout=c.dropout)


@dataclass
class Setup:
    tokenizer: Tokenizer
    family: FamilyConfig
    train: TokenDataset
    heldout: TokenDataset


def prepare_data(cfg: TrainConfig, tokenizer: Tokenizer | None = None) -> Setup:
    """Read the corpus, build (or reuse) the tokenizer, tokenize, split. Raises ``ValueError`` on bad data."""
    corpus = read_source(cfg.data)
    if tokenizer is None:
        texts = corpus.texts or [p + c for p, c in corpus.pairs]
        tokenizer = build_tokenizer(cfg.tokenizer, texts, vocab_size=cfg.vocab_size)
    family = cfg.family_config(tokenizer.mask_token_id)
    data = build_dataset(corpus, tokenizer, cfg.length)
    train_idx, eval_idx = heldout_split(len(data), cfg.eval_fraction, max_eval=cfg.eval_max, seed=cfg.split_seed)
    return Setup(tokenizer, family, data.subset(train_idx), data.subset(eval_idx))


def heldout_of(training_args: dict, tokenizer: Tokenizer) -> TokenDataset:
    """The held-out rows a run evaluated on, rebuilt from its recorded training arguments."""
    args = {k: v for k, v in training_args.items() if k in {f.name for f in config_fields()}}
    return prepare_data(TrainConfig(**args), tokenizer).heldout


def _check_resumable(saved: dict, cfg: TrainConfig, where: Path) -> None:
    for f in config_fields():
        if f.name in TrainConfig.RESUMABLE or f.name not in saved:
            continue
        if saved[f.name] != getattr(cfg, f.name):
            raise ValueError(f"cannot resume: {f.name}={getattr(cfg, f.name)!r} but the checkpoint {where} was "
                             f"trained with {f.name}={saved[f.name]!r}")


def _check_out_dir(cfg: TrainConfig) -> Path | None:
    """The checkpoint to resume from (or None); refuses to mix a new run into an old run folder."""
    out = Path(cfg.out)
    if out.exists() and not out.is_dir():
        raise ValueError(f"out {cfg.out!r} exists and is not a folder")
    latest = ckpt.latest_checkpoint(out) if out.is_dir() else None
    if latest is None and out.is_dir() and any((out / "checkpoints").glob("step-*")):
        raise ValueError(f"{out / ckpt.LATEST}: missing, but {out} holds checkpoints; repair or remove it")
    if latest is not None and not cfg.resume:
        raise ValueError(f"out {cfg.out!r} already holds a training run; pass --resume or choose another folder")
    return latest


@dataclass
class TrainResult:
    step: int
    loss: float | None
    eval: dict | None
    checkpoint: Path | None
    tokens_per_second: float
    resumed_from: int = 0
    history: list = field(default_factory=list)


# ---------------------------------------------------------------------------------------------------------
# the loop
# ---------------------------------------------------------------------------------------------------------


class _Run:
    """State of one training run in one process."""

    def __init__(self, cfg: TrainConfig, dist: Dist, setup: Setup, resume_from: Path | None,
                 init: nn.Module | None = None):
        self.cfg, self.dist, self.setup = cfg, dist, setup
        self.out = Path(cfg.out)
        torch.manual_seed(cfg.seed)  # identical initial weights in every process
        if resume_from is not None:  # the architecture and weights of the checkpoint (DiT or HF backbone)
            init = ckpt.load(resume_from).backbone
        backbone = init if init is not None else Transformer(cfg.model_config(setup.tokenizer.vocab_size))
        self.backbone = backbone.to(dist.device).train()
        self.backbone.grad_checkpointing = cfg.grad_checkpointing  # same gradients, less activation memory
        self.optimizer = torch.optim.AdamW(self.backbone.parameters(), lr=cfg.lr, betas=(cfg.beta1, cfg.beta2),
                                           eps=1e-8, weight_decay=cfg.weight_decay)
        self.step = 0
        self.ema: dict[str, Tensor] | None = None
        if resume_from is not None:
            self._restore(resume_from)
        elif cfg.ema:
            self.ema = {k: v.detach().clone().float() for k, v in ckpt.unique_state_dict(self.backbone).items()}
        net: nn.Module = self.backbone
        if dist.active:
            ids = [dist.device.index] if dist.device.type == "cuda" else None
            net = nn.parallel.DistributedDataParallel(net, device_ids=ids)
        self.net = torch.compile(net) if cfg.compile else net
        self.order = DataOrder(len(setup.train), cfg.seed)
        self.micro = cfg.batch_size // (cfg.grad_accum * dist.world)
        self.history: list[dict] = []

    def _restore(self, folder: Path) -> None:
        state, opt = ckpt.load_training_state(folder)
        if opt is not None:
            self.optimizer.load_state_dict(opt)
        self.step = int(state["step"])
        if self.cfg.ema:
            expected = ckpt.expected_shapes(self.backbone)
            ema = ckpt.read_tensors(folder / ckpt.EMA_WEIGHTS, expected, " (the run was configured with EMA)")
            self.ema = {k: v.float().to(self.dist.device) for k, v in ema.items()}

    # -- one optimizer step ---------------------------------------------------------------------------------

    def train_step(self) -> tuple[float, float, int]:
        """Returns (mean loss over this process's micro-batches, grad norm, tokens seen by this process)."""
        cfg, dist, s = self.cfg, self.dist, self.step
        lr = lr_at(cfg, s)
        for g in self.optimizer.param_groups:
            g["lr"] = lr
        rows = self.order.batch(s, cfg.batch_size)  # (G,) global batch
        per_rank = cfg.batch_size // dist.world
        mine = rows[dist.rank * per_rank:(dist.rank + 1) * per_rank]
        self.optimizer.zero_grad(set_to_none=True)
        loss_sum, tokens = 0.0, 0
        amp = torch.autocast(dist.device.type, dtype=torch.bfloat16) if cfg.bf16 else nullcontext()
        for m in range(cfg.grad_accum):
            batch = self.setup.train.batch(mine[m * self.micro:(m + 1) * self.micro]).to(dist.device)
            seed = derive_seed(cfg.seed, "step", s, dist.rank, m)
            torch.manual_seed(seed)  # dropout
            gen = torch.Generator(dist.device).manual_seed(seed)
            sync = self.net.no_sync() if dist.active and m < cfg.grad_accum - 1 else nullcontext()
            with sync:
                with amp:
                    out = compute_loss(self.net, self.setup.family, batch, train=True, generator=gen)
                (out.loss / cfg.grad_accum).backward()
            loss_sum += float(out.loss.detach())
            tokens += int(batch.attention_mask.sum())
        params = list(self.backbone.parameters())
        if cfg.clip > 0:
            norm = float(torch.nn.utils.clip_grad_norm_(params, cfg.clip))
        else:
            norm = float(torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in params if p.grad is not None])))
        self.optimizer.step()
        if self.ema is not None:
            with torch.no_grad():
                sd = self.backbone.state_dict()
                torch._foreach_lerp_(list(self.ema.values()), [sd[k].float() for k in self.ema], 1.0 - cfg.ema)
        self.step += 1
        return loss_sum / cfg.grad_accum, norm, tokens

    # -- evaluation and checkpoints -------------------------------------------------------------------------

    def evaluate(self) -> dict:
        model = self.backbone
        if self.cfg.eval_ema:
            model = copy.deepcopy(self.backbone)
            ckpt.load_weights(model, self.ema)  # copies, casting to the parameters' dtype
        return likelihood(model, self.setup.family, self.setup.heldout, batch_size=self.cfg.eval_batch_size,
                          seed=self.cfg.eval_seed, bf16=self.cfg.bf16, dist=self.dist)

    def save(self, last: dict) -> Path:
        divergence = replica_divergence(self.backbone, self.dist)
        name = f"checkpoints/step-{self.step:08d}"
        if self.dist.main:
            state = {"step": self.step, "data": self.order.position(self.step, self.cfg.batch_size),
                     "world_size": self.dist.world, "replica_max_abs_diff": divergence,
                     "lr_schedule": {"kind": self.cfg.lr_schedule, "lr": lr_at(self.cfg, max(self.step - 1, 0))},
                     "rng": "derived from (seed, step, rank, micro-batch); nothing to restore", "last": last}
            model = Model(self.backbone, self.setup.family, self.setup.tokenizer)
            ckpt.save(self.out / name, model, ema=self.ema, training_args=self.cfg.to_dict(),
                      training_state=state, optimizer_state=self.optimizer.state_dict())
            ckpt.write_text_atomic(self.out / ckpt.LATEST, name + "\n")
            self._prune()
        if self.dist.active:
            torch.distributed.barrier()
        return self.out / name

    def _prune(self) -> None:
        root = self.out / "checkpoints"
        done = sorted(p for p in root.iterdir() if p.name.startswith("step-"))
        for p in done[: -self.cfg.keep]:
            shutil.rmtree(p, ignore_errors=True)
        for p in root.iterdir():  # leftovers of a write killed half-way
            if p.name.startswith("."):
                shutil.rmtree(p, ignore_errors=True)

    def log(self, row: dict) -> None:
        self.history.append(row)
        if self.dist.main:
            with open(self.out / METRICS, "a", encoding="utf-8") as f:
                f.write(json.dumps(row) + "\n")


def _truncate_log(path: Path, step: int) -> None:
    """Drop log rows past ``step``: on resume those of the steps the crash lost (they are logged again), on
    a fresh start those of an earlier attempt that died before its first checkpoint."""
    if path.is_file():
        rows = [r for r in path.read_text(encoding="utf-8").splitlines() if r.strip()]
        keep = [r for r in rows if json.loads(r).get("step", 0) <= step]
        ckpt.write_text_atomic(path, "".join(r + "\n" for r in keep))


def resume_config(out: str | Path, **overrides) -> TrainConfig:
    """The configuration of the run in ``out`` (its latest checkpoint's training arguments) with
    ``overrides`` applied and ``resume=True``; a run without a checkpoint yet starts from the preset."""
    latest = ckpt.latest_checkpoint(out) if Path(out).is_dir() else None
    if latest is None:
        return TrainConfig.from_preset(overrides.pop("preset", "tiny"), out=str(out), resume=True, **overrides)
    saved = ckpt.read_config(latest).get("training") or {}
    names = {f.name for f in config_fields()}
    return TrainConfig(**{**{k: v for k, v in saved.items() if k in names}, **overrides, "out": str(out),
                          "resume": True})


def train(cfg: TrainConfig) -> TrainResult:
    """Train ``cfg`` to ``cfg.steps`` optimizer steps; see the module docstring."""
    dist = init_dist(cfg.device)
    resume_from = _check_out_dir(cfg)
    tokenizer, setup, init = None, None, None
    if resume_from is not None:
        saved = ckpt.read_config(resume_from).get("training") or {}
        _check_resumable(saved, cfg, resume_from)
        tokenizer = ckpt.load(resume_from).tokenizer
    elif cfg.init_from:  # every process loads the same weights and tokenizer
        init, tokenizer = load_init(cfg.init_from)
        cfg = _with_init_architecture(cfg, init)
    elif dist.active:  # one tokenizer for all processes (BPE training need not be bitwise reproducible)
        setup = prepare_data(cfg) if dist.main else None
        msg = [setup.tokenizer.to_json() if dist.main else None]
        torch.distributed.broadcast_object_list(msg, 0)
        tokenizer = Tokenizer.from_json(msg[0])
    setup = setup or prepare_data(cfg, tokenizer)  # every check of the inputs happens before anything is written
    if cfg.batch_size % (cfg.grad_accum * dist.world):
        raise ValueError(f"batch_size {cfg.batch_size} is not divisible by grad_accum × processes = "
                         f"{cfg.grad_accum} × {dist.world}")
    run = _Run(cfg, dist, setup, resume_from, init)
    start = run.step
    if start >= cfg.steps:
        raise ValueError(f"the checkpoint is at step {start}, which is not below steps={cfg.steps}; raise --steps")
    if dist.main:
        run.out.mkdir(parents=True, exist_ok=True)
        _truncate_log(run.out / METRICS, start)
        if resume_from is not None:
            print(f"resuming from {resume_from} at step {start}", file=sys.stderr)
    bar = tqdm(total=cfg.steps, initial=start, desc=f"train {cfg.family}", disable=None if dist.main else True,
               dynamic_ncols=True)
    t0 = t_log = time.perf_counter()
    tok_total = tok_log = 0
    loss_acc, n_acc, loss = 0.0, 0, None
    evaluation, path = None, None
    while run.step < cfg.steps:
        step_loss, norm, tokens = run.train_step()
        s = run.step
        tok_log, tok_total = tok_log + tokens, tok_total + tokens
        loss_acc, n_acc = loss_acc + step_loss, n_acc + 1
        bar.update(1)
        if s % cfg.log_every == 0 or s == cfg.steps:
            stats = _all_reduce(torch.tensor([loss_acc / n_acc, float(tok_log)], dtype=torch.float64,
                                             device=dist.device), dist)
            now = time.perf_counter()
            loss, tps = stats[0].item() / dist.world, stats[1].item() / max(now - t_log, 1e-9)
            run.log({"step": s, "loss": loss, "lr": lr_at(cfg, s - 1), "grad_norm": norm, "tokens_per_s": tps})
            bar.set_postfix(loss=f"{loss:.4f}", tok_s=f"{tps:,.0f}")
            t_log, tok_log, loss_acc, n_acc = now, 0, 0.0, 0
        if (cfg.eval_every and s % cfg.eval_every == 0) or s == cfg.steps:
            evaluation = run.evaluate()
            run.log({"step": s, "split": "heldout", **evaluation})
            if dist.main:
                bar.write(f"step {s}: held-out nelbo {evaluation['nelbo']:.4f} ppl {evaluation['ppl']:.2f} "
                          f"({evaluation['tokens']} tokens)", file=sys.stderr)
        if (cfg.save_every and s % cfg.save_every == 0) or s == cfg.steps:
            path = run.save({"loss": loss})
    bar.close()
    elapsed = time.perf_counter() - t0
    total = _all_reduce(torch.tensor(float(tok_total), dtype=torch.float64, device=dist.device), dist).item()
    return TrainResult(run.step, loss, evaluation, path, total / max(elapsed, 1e-9), start, run.history)


def main(argv: list[str] | None = None) -> int:
    from .cli import main as cli_main

    return cli_main(["train", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())
