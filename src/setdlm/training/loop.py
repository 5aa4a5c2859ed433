"""The training recipe (docs/method.md §2.1, §2.9, §5.1, §9.6): setup → train → save → cleanup.

AdamW with linear warm-up then a constant or cosine learning rate, gradient clipping, EMA weights, gradient
accumulation, opt-in bf16 autocast and ``torch.compile``, periodic evaluation of the held-out bound, tqdm
progress and a JSONL metrics log, checkpoints and ``--resume``. ``init_from`` starts from existing weights
instead of a random DiT (:func:`setdlm.formats.loading.load_for_training`). Started by ``torchrun`` the same
command trains on several processes (:mod:`setdlm.training.distributed`: DDP, or FSDP2 with
``strategy="fsdp"``); ``batch_size`` is always the *global* batch.

Reproducibility and exact resume: nothing random is carried from step to step. The data order of epoch
``e`` is a permutation seeded by ``(seed, e)``, and the randomness of step ``s`` (orders, masks, dropout)
is seeded by ``(seed, s, micro-batch)`` (:mod:`setdlm.training.schedule`); the learning rate is a function
of ``s``. A checkpoint thus only needs the weights, the EMA, the optimizer moments and ``s``: a run killed
with SIGKILL and resumed produces bitwise the same weights as an uninterrupted one (at the same thread
count). While it trains, a process holds an OS lock on its run folder
(:class:`~setdlm.training.run_folder.RunLock`), so a second run into it is refused.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from tqdm.auto import tqdm

from ..errors import UserError
from ..formats import checkpoint as ckpt
from ..data import Tokenizer
from ..formats.loading import load_for_training
from ..model import Transformer
from ..resources import native_bf16
from .config import TrainConfig
from .data import prepare_data
from .distributed import Dist, all_reduce, init_dist
from .memory import check_memory
from .run_folder import METRICS, RunLock, append_log, check_out_dir, check_resumable, prune, remove_if_unused, \
    truncate_log
from .schedule import lr_at
from .sharded import is_sharded, read_skeleton
from .state import TrainState


@dataclass
class TrainResult:
    step: int
    loss: float | None
    eval: dict | None
    checkpoint: Path | None
    tokens_per_second: float
    resumed_from: int = 0
    history: list = field(default_factory=list)


def train(cfg: TrainConfig) -> TrainResult:
    """Train ``cfg`` to ``cfg.steps`` optimizer steps; see the module docstring."""
    dist = init_dist(cfg.system.device, cfg.system.strategy)
    out = Path(cfg.out)
    fresh = [p for p in (out, out / ".lock") if not p.exists()]  # what this run creates before its first write
    lock = RunLock(out)
    done = False
    try:
        if dist.is_main:
            lock.check()
        state, resume_from = setup(cfg, dist, lock)
        result = run(cfg, state, dist, resume_from)
        done = True
        return result
    finally:  # cleanup
        lock.release()
        if dist.is_main and not done:
            remove_if_unused(out, fresh)


def _starting_point(cfg: TrainConfig, dist: Dist, resume_from: Path | None):
    """``(cfg, init backbone or None, tokenizer or None)``: the checkpoint resumed (read once), the weights
    ``init_from`` names (whose DiT architecture replaces the preset's), or nothing (a fresh DiT)."""
    if resume_from is not None:
        config = ckpt.read_config(resume_from)  # read once: checked here, then the weights and tokenizer
        check_resumable(config.get("training") or {}, cfg, resume_from)
        read = read_skeleton if is_sharded(resume_from) else lambda f, c: ckpt.read(f, config=c)
        stored = read(resume_from, config)
        return cfg, stored.backbone, stored.tokenizer
    if cfg.model.init_from:  # every process loads the same weights and tokenizer
        init, tokenizer = load_for_training(cfg.model.init_from)
        if isinstance(init, Transformer):
            c = init.config
            cfg = cfg.replace(hidden_size=c.hidden_size, n_layers=c.n_layers, n_heads=c.n_heads, dropout=c.dropout)
        return cfg, init, tokenizer
    return cfg, None, None


def setup(cfg: TrainConfig, dist: Dist, lock: RunLock) -> tuple[TrainState, Path | None]:
    """Check the run folder and the inputs, build the data, the model and the optimizer (restored when
    resuming), then take the run folder. Nothing is written before every check has passed."""
    resume_from = check_out_dir(cfg)
    if cfg.checkpointing.resume and resume_from is None and dist.is_main:
        print(f"{cfg.out}: no checkpoint to resume from yet; starting from scratch", file=sys.stderr)
    cfg, init, tokenizer = _starting_point(cfg, dist, resume_from)
    data = None
    if tokenizer is None and dist.active:  # one tokenizer for all (BPE training need not be bitwise reproducible)
        data = prepare_data(cfg) if dist.is_main else None
        msg: list[str | None] = [data.tokenizer.to_json() if data is not None else None]  # rank 0's data only
        torch.distributed.broadcast_object_list(msg, 0)
        assert msg[0] is not None  # every rank holds rank 0's tokenizer now
        tokenizer = Tokenizer.from_json(msg[0])
    data = data or prepare_data(cfg, tokenizer)  # every check of the inputs happens before anything is written
    data.tokenizer.prompt = "bos"  # the rows start with BOS, so the trained model is decoded from [BOS] + text
    o = cfg.optim
    if o.batch_size % (o.grad_accum * dist.world):
        raise UserError(f"batch_size {o.batch_size} is not divisible by grad_accum × processes = "
                         f"{o.grad_accum} × {dist.world}")
    if resume_from is None:  # a resumed run already fitted
        check_memory(cfg, init, data.tokenizer.vocab_size, dist.device, dist.world)
    if cfg.system.bf16 and dist.is_main and not native_bf16(dist.device):
        print(f"warning: --bf16 on a {dist.device.type} without native bf16 (no AVX512-BF16 or AMX): PyTorch "
              "emulates it, and training is much slower than in float32 (docs/training.md); drop --bf16",
              file=sys.stderr)
    state = TrainState(cfg, dist, data, resume_from, init)
    if state.step >= o.steps:
        raise UserError(f"the checkpoint is at step {state.step}, which is not below steps={o.steps}; raise steps",
                        fields=("steps",))
    if dist.is_main:
        for line in start_report(cfg, state, built_tokenizer=tokenizer is None and resume_from is None):
            print(line, file=sys.stderr if line.startswith("warning:") else sys.stdout, flush=True)
    if dist.is_main:
        out = Path(cfg.out)
        out.mkdir(parents=True, exist_ok=True)
        lock.acquire()
        if check_out_dir(cfg) != resume_from:  # another process wrote here while this one prepared
            raise UserError(f"{out}: another run wrote a checkpoint here while this one started; choose "
                            "another out", fields=("out",))
        truncate_log(out / METRICS, state.step)
        if resume_from is not None:
            print(f"resuming from {resume_from} at step {state.step}", file=sys.stderr)
    return state, resume_from


# fewer held-out rows than this make the held-out bound too noisy to compare runs by
FEW_HELDOUT = 8


def start_report(cfg: TrainConfig, state: TrainState, *, built_tokenizer: bool) -> list[str]:
    """What a run prints as it starts: a warning for each setting that will not do what it says (a BPE
    vocabulary the text cannot fill, a held-out set of a few rows, a warm-up longer than the run), then one
    summary line (parameters, tokenizer, rows, held-out rows, tokens per step)."""
    d, o, e = cfg.corpus, cfg.optim, cfg.evaluation
    setup, lines = state.setup, []
    vocab = setup.tokenizer.vocab_size
    if built_tokenizer and d.tokenizer == "bpe" and vocab < d.vocab_size:
        lines.append(f"warning: --vocab-size {d.vocab_size} asked, but the BPE tokenizer learned only {vocab} "
                     "tokens from this text (too little text for more merges)")
    rows, held = len(setup.train_rows) + len(setup.heldout_rows), len(setup.heldout_rows)
    if held < FEW_HELDOUT:
        lines.append(f"warning: the held-out set is {held} row{'s' if held != 1 else ''} (--eval-fraction "
                     f"{d.eval_fraction} of {rows} rows): its bound is noisy; give more text or a larger "
                     "--eval-fraction")
    if o.warmup > o.steps:
        lines.append(f"warning: --warmup {o.warmup} is longer than --steps {o.steps}: the learning rate never "
                     f"reaches --lr {o.lr:g}; lower --warmup")
    params = sum(p.numel() for p in state.backbone.parameters())
    lines.append(f"training {cfg.objective.family} ({params / 1e6:.2f}M parameters) on {d.data}: tokenizer "
                 f"{setup.tokenizer.kind}, {vocab:,} tokens; {len(setup.train_rows):,} rows of {d.length} tokens, "
                 f"{held:,} held out; {o.batch_size * d.length:,} tokens per step; steps {state.step + 1}-{o.steps}, "
                 f"a loss line every {e.log_every}")
    return lines


def run(cfg: TrainConfig, state: TrainState, dist: Dist, resume_from: Path | None) -> TrainResult:
    """Train from ``state.step`` to ``steps``: log every ``log_every``, evaluate every ``eval_every``, save
    every ``save_every`` steps and at the end."""
    out, start, history = Path(cfg.out), state.step, []
    e, c = cfg.evaluation, cfg.checkpointing

    def log(row: dict) -> None:
        history.append(row)
        if dist.is_main:
            append_log(out, row)

    bar = tqdm(total=cfg.optim.steps, initial=start, desc=f"train {cfg.objective.family}",
               disable=None if dist.is_main else True, dynamic_ncols=True)
    t0 = t_log = time.perf_counter()
    tok_total = tok_log = 0
    loss_acc, n_acc, loss = 0.0, 0, None
    evaluation, path = None, None
    while state.step < cfg.optim.steps:
        step_loss, norm, tokens = state.train_step()
        s, last = state.step, state.step == cfg.optim.steps
        tok_log, tok_total = tok_log + tokens, tok_total + tokens
        loss_acc, n_acc = loss_acc + step_loss, n_acc + 1
        bar.update(1)
        if s % e.log_every == 0 or last:
            stats = all_reduce(torch.tensor([loss_acc / n_acc, float(tok_log)], dtype=torch.float64,
                                            device=dist.device), dist)
            now = time.perf_counter()
            loss, tps = stats[0].item() / dist.world, stats[1].item() / max(now - t_log, 1e-9)
            log({"step": s, "loss": loss, "lr": lr_at(cfg.optim, s - 1), "grad_norm": norm, "tokens_per_s": tps})
            bar.set_postfix(loss=f"{loss:.4f}", tok_s=f"{tps:,.0f}")
            if dist.is_main:  # stdout, flushed: a pipe or a log file shows it as it happens
                bar.write(f"step {s}: loss {loss:.4f}, lr {lr_at(cfg.optim, s - 1):.3g}, {tps:,.0f} tokens/s",
                          file=sys.stdout)
                sys.stdout.flush()
            t_log, tok_log, loss_acc, n_acc = now, 0, 0.0, 0
        if (e.eval_every and s % e.eval_every == 0) or last:
            evaluation = state.evaluate()
            log({"step": s, "split": "heldout", **evaluation})
            if dist.is_main:
                bar.write(f"step {s}: held-out nelbo {evaluation['nelbo']:.4f} ppl {evaluation['ppl']:.2f} "
                          f"({evaluation['tokens']} tokens)", file=sys.stderr)
        if (c.save_every and s % c.save_every == 0) or last:
            path = save(state, out, {"loss": loss}, c.keep, dist)
    bar.close()
    elapsed = time.perf_counter() - t0
    total = all_reduce(torch.tensor(float(tok_total), dtype=torch.float64, device=dist.device), dist).item()
    return TrainResult(state.step, loss, evaluation, path, total / max(elapsed, 1e-9), start, history)


def save(state: TrainState, out: Path, last: dict, keep: int, dist: Dist) -> Path:
    """Checkpoint the state, then keep the newest ``keep`` checkpoints."""
    path = state.save(out, last)
    if dist.is_main:
        prune(out, keep)
    return path
