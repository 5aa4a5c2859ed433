"""The training loop (docs/method.md §2.1, §2.9, §5.1, §9.6): ``setdlm train`` / ``python -m setdlm.train``.

AdamW with linear warm-up then a constant or cosine learning rate, gradient clipping, EMA weights,
gradient accumulation, opt-in bf16 autocast and ``torch.compile``, periodic evaluation of the held-out
bound (:func:`likelihood`), tqdm progress and a JSONL metrics log, checkpoints (:mod:`setdlm.checkpoint`)
and ``--resume``. ``--init-from`` starts from existing weights instead of a random DiT (:func:`load_init`):
a setdlm checkpoint of any family (e.g. AR → SetDLM adaptation) or a Hugging Face causal LM (docs/method.md §2.9). Started by ``torchrun --nproc_per_node=N`` the same command trains data-parallel (DDP;
gloo on CPU, nccl on GPU); ``batch_size`` is always the *global* batch.

Reproducibility and exact resume: nothing random is carried from step to step. The data order of epoch
``e`` is a permutation seeded by ``(seed, e)``, and the randomness of step ``s`` (orders, masks, dropout)
is seeded by ``(seed, s, rank, micro-batch)``; the learning rate is a function of ``s``. A checkpoint thus
only needs the weights, the EMA, the optimizer moments and ``s``: a run killed with SIGKILL and resumed
produces bitwise the same weights as an uninterrupted one (at the same thread count). While it trains, a
process holds an OS lock on its run folder (:class:`RunLock`), so a second run into it is refused.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import hashlib
import json
import math
import os
import shutil
import sys
import time
import typing
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import torch
from torch import Tensor, nn
from tqdm.auto import tqdm

from . import checkpoint as ckpt
from .data import TokenDataset, Tokenizer, build_dataset, build_tokenizer, heldout_split, read_source
from .evaluate import likelihood as likelihood_bound
from .family import FAMILIES, FamilyConfig
from .lm import Model
from .loading import load, locate
from .seeds import derive_seed
from .model import TransformerConfig, Transformer
from .objectives import compute_loss
from .presets import preset as preset_values
from .resources import check_fits, native_bf16, resolve_device

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
    keep_clean_bos: bool = _f("setdlm: BOS first in the reveal order and scored in training, not in the bound "
                              "(the paper's LM1B/OWT setting; on in those presets)", default=False)
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
    eval_seed: int = _f("seed of the evaluation's random orders/masks (docs/method.md §5.1 uses 1)", default=1)
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
    allow_data_change: bool = _f("with --resume: continue although the training data changed since the "
                                 "checkpoint (its tokenized rows' sha256 is recorded)", default=False)

    # fields that may change when resuming a run
    RESUMABLE = ("steps", "eval_every", "save_every", "keep", "log_every", "resume", "device", "compile", "out",
                 "grad_checkpointing", "allow_data_change")

    def __post_init__(self):
        hints = typing.get_type_hints(TrainConfig)
        for f in fields(self):  # types first, so that the range checks below compare numbers
            v, kind = getattr(self, f.name), hints[f.name]
            if kind is float and (isinstance(v, bool) or not isinstance(v, (int, float))):
                raise TypeError(f"{f.name} must be a number, got {type(v).__name__} {v!r}")
            if kind is bool and not isinstance(v, bool):
                raise TypeError(f"{f.name} must be True or False, got {type(v).__name__} {v!r}")
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
        if not isinstance(self.data, str) or not self.data.strip():
            raise ValueError(f"data must name a text source (a file, folder, built-in corpus or hf:NAME), got "
                             f"{self.data!r}")
        if self.length < 2:
            raise ValueError(f"length (the context length L) must be at least 2, a BOS and one token to learn, "
                             f"got {self.length}")
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
                            k=self.k if f == "setdlm" else None,
                            keep_clean_bos=self.keep_clean_bos and f == "setdlm")

    def model_config(self, vocab_size: int) -> TransformerConfig:
        return TransformerConfig(vocab_size=vocab_size, hidden_size=self.hidden_size, n_heads=self.n_heads,
                           n_layers=self.n_layers, dropout=self.dropout)


def config_fields() -> tuple[dataclasses.Field, ...]:
    return fields(TrainConfig)


# ---------------------------------------------------------------------------------------------------------
# seeds, learning rate, data order
# ---------------------------------------------------------------------------------------------------------


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
    dev = resolve_device(device, local)
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
# evaluation of the held-out bound (docs/method.md §5.1)
# ---------------------------------------------------------------------------------------------------------


def likelihood(backbone: nn.Module, family: FamilyConfig, data: TokenDataset, *, batch_size: int = 16,
               seed: int = 1, bf16: bool = False, dist: Dist | None = None, progress: bool = False) -> dict:
    """The held-out bound the trainer logs and ``setdlm eval`` prints: :func:`setdlm.evaluate.likelihood`
    (the one estimator, docs/method.md §5.1) over the rows of ``data`` in batches of ``batch_size``, as a dict:
    ``nelbo = Σ nll / Σ tokens`` (nats per token), ``ppl``, ``bpd``, ``tokens``, and ``loss`` (the mean of
    the per-batch bounds, the reference's ``loss``). Batch ``i`` draws its orders/masks from a generator
    seeded by ``(seed, i)``, so the result does not depend on the number of processes (``dist``)."""
    if len(data) == 0:
        raise ValueError("no rows to evaluate")
    res = likelihood_bound(Model(backbone, family), data.batches(batch_size), seed=seed, bf16=bf16,
                           dist=dist, progress=progress)
    nelbo = res.nats_per_token
    return {"nelbo": nelbo, "ppl": math.exp(min(nelbo, 700)), "bpd": nelbo / math.log(2), "tokens": res.tokens,
            "loss": res.batch_mean}


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
    folder = locate(name_or_path)
    if ckpt.is_checkpoint(folder) or is_reference_folder(folder):
        model = load(folder, dtype=torch.float32)
        if not isinstance(model.tokenizer, Tokenizer):
            raise ValueError(f"--init-from {name_or_path!r}: no tokenizer found with the weights")
        return model.backbone.train(), model.tokenizer
    if folder.is_dir():  # a local folder or a Hub snapshot: check the weights before transformers reads them
        weights = sorted(folder.glob("*.safetensors"))
        pickles = [f for f in folder.iterdir() if f.suffix in ckpt.PICKLE_SUFFIXES]
        if not weights and pickles:
            ckpt.refuse_pickle(pickles[0])
            raise ValueError(f"{pickles[0]}: setdlm loads safetensors weights only; convert it to safetensors")
        for f in weights:
            ckpt.check_safetensors(f)
    try:
        from .hf import load_pretrained, setdlm_tokenizer

        import transformers  # noqa: F401 (checked here, so the error can say how to install it)
    except ImportError:
        raise ValueError(f'--init-from {name_or_path!r} is a Hugging Face model, which needs transformers: '
                         'pip install "setdlm[hf]" (in a checkout: pip install -e ".[hf]")') from None
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


def data_digest(setup: Setup) -> str:
    """sha256 of the tokenized training and held-out rows (ids, padding and prompt masks): a checkpoint
    records it, so that ``--resume`` on changed data (an edited file, another tokenization) is noticed."""
    h = hashlib.sha256()
    for ds in (setup.train, setup.heldout):
        for t in (ds.input_ids, ds.attention_mask, ds.context_mask):
            h.update(str(tuple(t.shape)).encode())
            h.update(t.contiguous().numpy().tobytes())
    return h.hexdigest()


def _check_same_data(folder: Path, recorded: str | None, setup: Setup, cfg: TrainConfig) -> None:
    """Refuse to resume on data other than the checkpoint's (``recorded``: its training state's digest)
    unless ``allow_data_change``; checkpoints saved before the digest was recorded are not checked."""
    if recorded is None or cfg.allow_data_change:
        return
    now = data_digest(setup)
    if now != recorded:
        raise ValueError(f"cannot resume: the training data changed since {folder} (sha256 of its tokenized rows "
                         f"{recorded[:12]}..., now {now[:12]}...); restore the data, or pass --allow-data-change "
                         "to continue on the new data")


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
    """The checkpoint to resume from (or None); refuses to mix a new run into an old run folder, a checkpoint
    folder or a folder inside another run."""
    out = Path(cfg.out)
    if out.exists() and not out.is_dir():
        raise ValueError(f"out {cfg.out!r} exists and is not a folder")
    if ckpt.is_checkpoint(out):
        raise ValueError(f"out {cfg.out!r} is a checkpoint folder, not a run folder; choose another --out")
    for parent in out.absolute().parents:
        if (parent / ckpt.LATEST).is_file() and (parent / "checkpoints").is_dir():
            raise ValueError(f"out {cfg.out!r} lies inside the training run {str(parent)!r}; choose a folder "
                             "outside it")
    latest = ckpt.latest_checkpoint(out) if out.is_dir() else None
    if latest is None and out.is_dir() and any((out / "checkpoints").glob("step-*")):
        raise ValueError(f"{out / ckpt.LATEST}: missing, but {out} holds checkpoints; repair or remove it")
    if latest is not None and not cfg.resume:
        raise ValueError(f"out {cfg.out!r} already holds a training run; pass --resume or choose another folder")
    log = out / METRICS
    if log.is_file():
        rows = _read_log(log)
        if rows and latest is None and not cfg.resume:  # never truncate the log of another run
            raise ValueError(f"{log}: holds {len(rows)} rows of another run (no checkpoint yet); pass --resume to "
                             "restart that run, or choose another --out")
    return latest


class RunLock:
    """An OS lock (``flock``) on ``RUN/.lock``, held while a process trains into the run folder: a second
    process training into the same ``--out`` is refused at start, naming the holder. The kernel releases
    the lock when its holder dies, even by SIGKILL, so a stale lock never blocks a resume."""

    def __init__(self, out: Path):
        self.path = Path(out) / ".lock"
        self.file = None

    def acquire(self, sign: bool = True) -> None:
        """Take the lock; ``sign``: write this process into the file (once the run really starts)."""
        import fcntl
        import socket

        if self.file is not None:
            if sign:
                self._sign(socket.gethostname())
            return
        f = open(self.path, "a+", encoding="utf-8")
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            f.seek(0)
            holder = f.read().strip() or "another process"
            f.close()
            raise ValueError(f"{self.path.parent}: another training run is writing into this folder ({holder}); "
                             "wait for it to end or choose another --out") from None
        self.file = f
        if sign:
            self._sign(socket.gethostname())

    def _sign(self, host: str) -> None:
        self.file.seek(0)
        self.file.truncate()
        self.file.write(f"pid {os.getpid()} on {host}, since {time.strftime('%Y-%m-%d %H:%M:%S')}\n")
        self.file.flush()

    def check(self) -> None:
        """Refuse early (before reading the data) when the folder exists and is locked; the lock is held from
        here on, but the file is left as it is until the run starts (a refused run changes nothing)."""
        if self.path.is_file():
            self.acquire(sign=False)

    def release(self) -> None:
        if self.file is not None:
            self.file.close()  # closing the descriptor drops the flock
            self.file = None


def check_memory(cfg: TrainConfig, backbone: nn.Module | None, vocab_size: int, device: torch.device,
                 world: int) -> None:
    """Refuse sizes that cannot fit before allocating anything: a lower bound of parameters, gradients
    and AdamW moments (16 bytes per parameter in float32, + 4 with EMA) and of the activations kept for the
    backward pass (at least 4 floats of width d per position, layer and row of a micro-batch; SetDLM and
    BD3LM see 2L positions per row, the clean and the noisy stream)."""
    if backbone is None:
        with torch.device("meta"):
            backbone = Transformer(cfg.model_config(vocab_size))
    n_params = sum(p.numel() for p in backbone.parameters())
    d = getattr(getattr(backbone, "config", None), "hidden_size", cfg.hidden_size)
    layers = getattr(getattr(backbone, "config", None), "n_layers", cfg.n_layers)
    streams = 2 if cfg.family in ("setdlm", "bd3lm") else 1
    rows = cfg.batch_size // (cfg.grad_accum * world)
    needed = n_params * (20 if cfg.ema else 16) + rows * streams * cfg.length * layers * d * 4 * 4
    check_fits(f"training {n_params:,} parameters on micro-batches of {rows} rows", needed, device,
               "lower --hidden-size / --n-layers, or --batch-size (or raise --grad-accum)")


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
        """``init``: the starting backbone (``--init-from``, or the checkpoint ``resume_from`` read once by
        :func:`_train`), else a fresh DiT; ``resume_from`` also restores the optimizer, step and EMA."""
        self.cfg, self.dist, self.setup = cfg, dist, setup
        self.out = Path(cfg.out)
        torch.manual_seed(cfg.seed)  # identical initial weights in every process
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
        self.digest: str | None = None  # data_digest, computed at the first checkpoint

    def _restore(self, folder: Path) -> None:
        state, opt = ckpt.load_training_state(folder)
        _check_same_data(folder, state.get("data_sha256"), self.setup, self.cfg)
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
            self.digest = self.digest or data_digest(self.setup)
            state = {"step": self.step, "data": self.order.position(self.step, self.cfg.batch_size),
                     "data_sha256": self.digest,
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
            try:
                with open(self.out / METRICS, "a", encoding="utf-8") as f:
                    f.write(json.dumps(row) + "\n")
            except OSError as e:  # disk full, read-only: one line naming the file
                raise ValueError(f"{self.out / METRICS}: cannot write ({e.strerror or e})") from None


def _read_log(path: Path) -> list[tuple[int, str]]:
    """The ``(step, row)`` pairs of a metrics log, each row checked to be a JSON object with an integer
    ``step``."""
    try:
        rows = [r for r in path.read_text(encoding="utf-8").splitlines() if r.strip()]
    except UnicodeDecodeError:
        raise ValueError(f"{path}: not UTF-8 text; it is not a setdlm metrics log") from None
    steps = []
    for n, r in enumerate(rows, 1):
        try:
            step = json.loads(r).get("step")
        except (json.JSONDecodeError, AttributeError):
            step = None
        if not isinstance(step, int):
            raise ValueError(f"{path}:{n}: not a metrics row (a JSON object with an integer \"step\"); repair or "
                             "remove the file")
        steps.append(step)
    return list(zip(steps, rows))


def _truncate_log(path: Path, step: int) -> None:
    """Drop log rows past ``step``: on resume those of the steps the crash lost (they are logged again), or
    all rows of an attempt that died before its first checkpoint (``_check_out_dir`` has refused a log of
    another run)."""
    if not path.is_file():
        return
    rows = _read_log(path)
    keep = [r for s, r in rows if s <= step]
    if len(keep) < len(rows):
        ckpt.write_text_atomic(path, "".join(r + "\n" for r in keep))


def resume_config(out: str | Path, **given) -> TrainConfig:
    """The configuration of the run in ``out``: its latest checkpoint's training arguments, with the
    arguments the user actually ``given`` applied on top (``train`` then refuses those that would change the
    run), and ``resume=True``. A run killed before its first checkpoint has nothing to resume: it starts
    from scratch with the given arguments (``preset`` default ``tiny``), and says so."""
    given = {k: v for k, v in given.items() if k not in ("out", "resume")}
    latest = ckpt.latest_checkpoint(out) if Path(out).is_dir() else None
    if latest is None:  # train() says so
        return TrainConfig.from_preset(given.pop("preset", "tiny"), **given, out=str(out), resume=True)
    saved = ckpt.read_config(latest).get("training") or {}
    if not saved:
        raise ValueError(f"{latest / ckpt.CONFIG}: records no training arguments, so the run cannot resume")
    names = {f.name for f in config_fields()} - {"allow_data_change"}  # given each time, never carried over
    return TrainConfig(**{**{k: v for k, v in saved.items() if k in names}, **given, "out": str(out),
                          "resume": True})


def train(cfg: TrainConfig) -> TrainResult:
    """Train ``cfg`` to ``cfg.steps`` optimizer steps; see the module docstring."""
    dist = init_dist(cfg.device)
    out = Path(cfg.out)
    fresh = [p for p in (out, out / ".lock") if not p.exists()]  # what this run creates before its first write
    lock = RunLock(out)
    done = False
    try:
        if dist.main:
            lock.check()
        result = _train(cfg, dist, lock)
        done = True
        return result
    finally:
        lock.release()
        if dist.main and not done:
            _remove_if_unused(out, fresh)


def _remove_if_unused(out: Path, fresh: list[Path]) -> None:
    """After a run that stopped before writing anything (refused, or failed while starting): remove the
    lock file and the folder it created, so that a refused ``--out`` is left exactly as it was."""
    if not out.is_dir() or any(p.name != ".lock" for p in out.iterdir()):
        return
    for p in fresh[::-1]:  # the lock file first, then the folder
        with contextlib.suppress(OSError):
            p.unlink() if p.name == ".lock" else p.rmdir()


def _train(cfg: TrainConfig, dist: Dist, lock: RunLock) -> TrainResult:
    resume_from = _check_out_dir(cfg)
    if cfg.resume and resume_from is None and dist.main:
        print(f"{cfg.out}: no checkpoint to resume from yet; starting from scratch", file=sys.stderr)
    tokenizer, setup, init = None, None, None
    if resume_from is not None:
        config = ckpt.read_config(resume_from)  # read once: checked here, then the weights and tokenizer
        _check_resumable(config.get("training") or {}, cfg, resume_from)
        resumed = ckpt.read(resume_from, config=config)
        tokenizer, init = resumed.tokenizer, resumed.backbone  # the checkpoint's architecture (DiT or HF)
    elif cfg.init_from:  # every process loads the same weights and tokenizer
        init, tokenizer = load_init(cfg.init_from)
        cfg = _with_init_architecture(cfg, init)
    elif dist.active:  # one tokenizer for all processes (BPE training need not be bitwise reproducible)
        setup = prepare_data(cfg) if dist.main else None
        msg = [setup.tokenizer.to_json() if dist.main else None]
        torch.distributed.broadcast_object_list(msg, 0)
        tokenizer = Tokenizer.from_json(msg[0])
    setup = setup or prepare_data(cfg, tokenizer)  # every check of the inputs happens before anything is written
    setup.tokenizer.prompt = "bos"  # the rows start with BOS, so the trained model is decoded from [BOS] + text
    if cfg.batch_size % (cfg.grad_accum * dist.world):
        raise ValueError(f"batch_size {cfg.batch_size} is not divisible by grad_accum × processes = "
                         f"{cfg.grad_accum} × {dist.world}")
    if resume_from is None:  # a resumed run already fitted
        check_memory(cfg, init, setup.tokenizer.vocab_size, dist.device, dist.world)
    if cfg.bf16 and dist.main and not native_bf16(dist.device):
        print(f"warning: --bf16 on a {dist.device.type} without native bf16 (no AVX512-BF16 or AMX): PyTorch "
              "emulates it, and training is much slower than in float32 (docs/training.md); drop --bf16",
              file=sys.stderr)
    run = _Run(cfg, dist, setup, resume_from, init)
    start = run.step
    if start >= cfg.steps:
        raise ValueError(f"the checkpoint is at step {start}, which is not below steps={cfg.steps}; raise --steps")
    if dist.main:
        run.out.mkdir(parents=True, exist_ok=True)
        lock.acquire()
        if _check_out_dir(cfg) != resume_from:  # another process wrote here while this one prepared
            raise ValueError(f"{run.out}: another run wrote a checkpoint here while this one started; choose "
                             "another --out")
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


# ---------------------------------------------------------------------------------------------------------
# command line: `setdlm train` and `python -m setdlm.train` share this parser (flags = TrainConfig's fields)
# ---------------------------------------------------------------------------------------------------------

_CHOICES = {"family": FAMILIES, "lr_schedule": ("constant", "cosine")}
_FAMILY_FLAGS = {"D": ("setdlm",), "M": ("setdlm",), "k": ("setdlm",), "block_size": ("bd3lm", "mdlm"),
                 "keep_clean_bos": ("setdlm",)}


def add_train_arguments(p: argparse.ArgumentParser) -> None:
    """One flag per field of :class:`TrainConfig` (``--preset`` among them); ``p`` must be made with
    ``argument_default=argparse.SUPPRESS``, so that only the flags given override the preset."""
    from .presets import PRESETS

    hints = typing.get_type_hints(TrainConfig)
    for f in config_fields():
        flag = "--" + (f.name if f.name in ("D", "M", "k") else f.name.replace("_", "-"))
        kind = hints[f.name]
        kind = next((a for a in typing.get_args(kind) if a is not type(None)), kind)
        help_ = f.metadata.get("help", "")
        if f.name == "preset":
            p.add_argument(flag, choices=tuple(PRESETS), help="tiny (CPU, seconds), small (probe size), lm1b, owt")
        elif kind is bool:  # --flag / --no-flag: a preset may turn one on (keep_clean_bos)
            p.add_argument(flag, action=argparse.BooleanOptionalAction, help=help_)
        elif f.name == "out":
            p.add_argument(flag, required=True, help=help_)
        else:
            p.add_argument(flag, type=kind, choices=_CHOICES.get(f.name), help=help_)


def run_train(args: argparse.Namespace) -> int:
    """Train a model (any family) on your text or a built-in corpus; resumable, torchrun-ready."""
    from .presets import PRESETS

    given = {f.name: getattr(args, f.name) for f in config_fields() if hasattr(args, f.name)}  # flags given only
    if given.get("preset", "tiny") not in PRESETS:
        raise ValueError(f"unknown preset {given['preset']!r}; choose one of {', '.join(PRESETS)}")
    if given.get("resume"):  # the saved configuration; only the flags given are compared with it
        cfg = resume_config(given.pop("out"), **given)
    else:
        cfg = TrainConfig.from_preset(given.pop("preset", "tiny"), **given)
    for name, families in _FAMILY_FLAGS.items():
        if name in given and cfg.family not in families:
            raise ValueError(f"--{name.replace('_', '-')} applies to {' and '.join(families)}, not to family "
                             f"{cfg.family!r}")
    result = train(cfg)
    if result.eval is not None:
        e = result.eval
        print(f"step {result.step}: loss {result.loss:.4f}, held-out nelbo {e['nelbo']:.4f} nats/token "
              f"(ppl {e['ppl']:.2f}), {result.tokens_per_second:,.0f} tokens/s; checkpoint {result.checkpoint}")
    return 0


def interrupted_note(out: str) -> str:
    """What a Ctrl-C of a run into ``out`` leaves behind, and how to continue it."""
    try:
        latest = ckpt.latest_checkpoint(out)
    except ValueError:
        latest = None
    if latest is None:
        return f"no checkpoint in {out} yet"
    return f"the latest checkpoint is {latest}; continue with: setdlm train --out {out} --resume"


def build_parser() -> argparse.ArgumentParser:
    """The parser of ``python -m setdlm.train`` (the same flags as ``setdlm train``)."""
    from .command import Parser

    p = Parser(prog="setdlm train", argument_default=argparse.SUPPRESS,
               description=run_train.__doc__ + " Defaults come from --preset; every flag overrides it.")
    add_train_arguments(p)
    return p


def main(argv: list[str] | None = None) -> int:
    from .command import run

    args = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    return run("train", lambda: run_train(args), lambda e: interrupted_note(args.out))


if __name__ == "__main__":
    sys.exit(main())
