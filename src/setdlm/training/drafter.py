"""Train a set drafter beside a frozen base on the base's own outputs (``setdlm train-drafter``, docs/drafter.md).

One command, resumable: (1) self-distillation, the base's greedy continuations of offline chat questions and word
problems (:mod:`setdlm.training.self_distill`; held-out prompts of the other split for validation); (2) the base's
hidden states at the drafter's feature layers, computed once (bfloat16 where the CPU has it natively); (3) the
window objective (:func:`setdlm.drafter.window_loss`) with AdamW and a cosine rate, stopping at ``steps`` or the
time budget, whichever comes first; a checkpoint (drafter, optimizer, step, metrics) every ``save_every`` steps and
at the end, written atomically, from which a killed run resumes; validation acceptance against training tokens in
``metrics.jsonl`` and ``acceptance.png``. The base never changes: only the drafter has gradients.
"""

from __future__ import annotations

import json
import math
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from tqdm import tqdm

from ..drafter import DrafterConfig, SetDrafter, draft_vocabulary, window_loss
from ..errors import UserError
from ..formats.atomic import write_folder
from ..formats.drafted import DraftedBackbone, base_features, is_drafter_folder, read_drafter, save_drafter
from ..formats.hf import HFBackbone
from ..formats.hf_modules import llama
from ..formats.loading import load
from ..lm import Model
from ..resources import native_bf16
from .self_distill import distill, distill_prompts


@dataclass
class DrafterTrainConfig:
    base: str = "smollm2-135m"
    out: str = "runs/drafter"
    chat: int = 1000  # self-distillation prompts: chat questions ...
    word: int = 500  # ... and word problems (train split)
    val_chat: int = 48  # held-out prompts (test split) for the validation curve
    val_word: int = 24
    max_new_tokens: int = 128
    window: int = 6
    n_layers: int = 2
    draft_vocab: int = 8192
    steps: int = 3000
    batch: int = 8  # sequences per step
    anchors: int = 24  # windows per sequence
    lr: float = 6e-4
    warmup: int = 50
    minutes: float = 90.0  # wall-clock budget of the whole command (distillation and features included)
    eval_every: int = 100
    save_every: int = 200
    seed: int = 0

    def __post_init__(self):
        for name in ("chat", "word", "val_chat", "val_word", "max_new_tokens", "steps", "batch", "anchors",
                     "n_layers", "draft_vocab", "eval_every", "save_every"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < (0 if name in ("chat", "word", "val_chat", "val_word") else 1):
                raise UserError(f"{name} must be a positive whole number, got {v!r}", fields=(name,))
        if self.chat + self.word < 1:
            raise UserError("chat + word must be at least 1 (the prompts to self-distill on)", fields=("chat",))
        if self.window < 2:
            raise UserError(f"window must be >= 2, got {self.window}", fields=("window",))
        if not (self.lr > 0 and math.isfinite(self.lr)):
            raise UserError(f"lr must be a positive number, got {self.lr!r}", fields=("lr",))
        if not self.minutes > 0:
            raise UserError(f"minutes must be > 0, got {self.minutes!r}", fields=("minutes",))


def new_drafter(backbone: HFBackbone, cfg: DrafterTrainConfig, counts: torch.Tensor, eos: list[int]) -> SetDrafter:
    """A drafter over ``backbone`` (an HFBackbone), started from the base's last layers."""
    hf = llama(backbone.hf)
    L = backbone.n_layers
    a = hf.model.layers[0].self_attn
    c = DrafterConfig(hidden_size=hf.config.hidden_size, n_layers=cfg.n_layers, n_heads=hf.config.num_attention_heads,
                      n_kv_heads=backbone.n_kv_heads, head_dim=a.head_dim,
                      intermediate_size=hf.config.intermediate_size,
                      feature_layers=(L // 3 - 1, 2 * L // 3 - 1, L - 1), window=cfg.window,
                      vocab_size=min(cfg.draft_vocab, counts.numel()),
                      rms_eps=float(getattr(hf.config, "rms_norm_eps", 1e-5)))
    d = SetDrafter(c)
    d.vocab_map.copy_(draft_vocabulary(counts, c.vocab_size, eos))
    emb = hf.get_input_embeddings().weight
    last = [backbone.hf.get_submodule(f"model.layers.{i}") for i in range(max(L - cfg.n_layers, 0), L)]
    d.init_from_base(last, hf.model.norm.weight, emb.mean(0))
    return d


def _features(base: HFBackbone, layers: tuple[int, ...], records: list[dict], progress: bool) -> list[dict]:
    """Each record's tokens and its base features (``base``'s precision, stored in bfloat16), prompt length kept."""
    out = []
    for r in tqdm(records, desc="base features", unit="seq", disable=not progress):
        ids = torch.tensor([r["prompt"] + r["completion"]])
        T = ids.shape[1]
        causal = torch.ones(T, T, dtype=torch.bool).tril()[None, None]
        with torch.no_grad():
            feats = base_features(base, ids, causal, layers)
        out.append({"ids": ids[0], "P": len(r["prompt"]), "feats": [f[0].to(torch.bfloat16) for f in feats]})
    return out


def _batch(items: list[dict], anchors: int, w: int, rng: random.Random, every: bool = False):
    """Padded tokens (B, N), features [(B, N, d)], anchors (B, A), valid (B, A). Anchors are committed-token
    positions in the continuation (the first at the prompt's last token), ``every``: all of them."""
    N = max(int(it["ids"].numel()) for it in items)
    B = len(items)
    toks = torch.zeros(B, N, dtype=torch.long)
    feats = [torch.zeros(B, N, f.shape[-1], dtype=torch.bfloat16) for f in items[0]["feats"]]
    cand = [list(range(it["P"] - 1, int(it["ids"].numel()) - 1)) for it in items]
    A = max(map(len, cand)) if every else anchors
    anc = torch.zeros(B, A, dtype=torch.long)
    valid = torch.zeros(B, A, dtype=torch.bool)
    for b, it in enumerate(items):
        n = int(it["ids"].numel())
        toks[b, :n] = it["ids"]
        for f, src in zip(feats, it["feats"]):
            f[b, :n] = src
        pick = cand[b] if every else rng.sample(cand[b], min(A, len(cand[b])))
        anc[b, :len(pick)] = torch.tensor(pick, dtype=torch.long)
        valid[b, :len(pick)] = True
    return toks, feats, anc, valid


def _loss(drafted: DraftedBackbone, batch) -> tuple[torch.Tensor, dict]:
    toks, feats, anc, valid = batch
    hf = llama(drafted.base.hf)
    return window_loss(drafted.drafter, [f.float() for f in feats], toks, anc, valid, hf.get_input_embeddings(),
                       hf.model.rotary_emb, drafted.draft_head.weight)


def validate(drafted: DraftedBackbone, items: list[dict]) -> dict:
    """Draft accuracy per offset and the mean accepted drafts (+1: tokens per forward of a greedy decode) over
    every window of the held-out sequences."""
    tot: dict[str, float] = {}
    n = 0
    with torch.no_grad():
        for i in range(0, len(items), 8):
            chunk = items[i:i + 8]
            _, stats = _loss(drafted, _batch(chunk, 0, drafted.drafter.config.window, random.Random(0), every=True))
            for k, v in stats.items():
                tot[k] = tot.get(k, 0.0) + v * len(chunk)
            n += len(chunk)
    out = {k: v / max(n, 1) for k, v in tot.items()}
    out["tokens_per_forward"] = 1.0 + out.get("accepted", 0.0)
    return out


def _save(out: Path, drafted: DraftedBackbone, opt, step: int, seen: int, cfg: DrafterTrainConfig) -> None:
    save_drafter(drafted.drafter, cfg.base, out / "drafter", dtype=torch.float32,
                 extra={"training": {**asdict(cfg), "step": step, "tokens": seen}})

    def fill(tmp: Path) -> None:
        torch.save({"opt": opt.state_dict(), "step": step, "seen": seen}, tmp / "state.pt")

    write_folder(out / "state", fill, replaceable=lambda p: (p / "state.pt").is_file())


def train_drafter(cfg: DrafterTrainConfig, progress: bool = True) -> Path:
    """Run the whole recipe (module docstring); returns the drafter folder ``<out>/drafter``."""
    t0 = time.monotonic()
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(cfg.seed)
    fast = native_bf16(torch.device("cpu"))
    model = load(cfg.base, dtype="bfloat16" if fast else None)
    base = _hf_base(model, cfg.base)
    train = distill(model, distill_prompts("train", cfg.chat, cfg.word, seed=cfg.seed), out / "distill-train.jsonl",
                    max_new_tokens=cfg.max_new_tokens, progress=progress)
    val = distill(model, distill_prompts("test", cfg.val_chat, cfg.val_word, seed=cfg.seed), out / "distill-val.jsonl",
                  max_new_tokens=cfg.max_new_tokens, progress=progress)
    model = load(cfg.base)  # float32 weights: the drafter trains in float32 over bfloat16 features
    if model.tokenizer is None or model.tokenizer.eos_token_id is None:
        raise UserError(f"{cfg.base}: a drafter's base needs a tokenizer with an EOS token (always drafted)")
    eos = [int(model.tokenizer.eos_token_id)]
    float_base = _hf_base(model, cfg.base)
    counts = torch.bincount(torch.tensor([t for r in train for t in r["completion"]]), minlength=base.vocab_size)
    if is_drafter_folder(out / "drafter"):
        _, drafter, saved = read_drafter(out / "drafter")
        step, seen = saved["training"]["step"], saved["training"]["tokens"]
    else:
        drafter, step, seen = new_drafter(float_base, cfg, counts, eos), 0, 0
    drafted = DraftedBackbone(float_base, drafter)
    for p in drafted.base.parameters():
        p.requires_grad_(False)
    drafted.draft_head.weight.requires_grad_(False)
    layers = drafter.config.feature_layers
    items, val_items = _features(base, layers, train, progress), _features(base, layers, val, progress)
    del base
    opt = torch.optim.AdamW(drafter.parameters(), lr=cfg.lr, weight_decay=0.0, betas=(0.9, 0.95))
    if (out / "state" / "state.pt").is_file() and step:
        opt.load_state_dict(torch.load(out / "state" / "state.pt", weights_only=True)["opt"])
    metrics = out / "metrics.jsonl"
    rng = random.Random(f"{cfg.seed}:{step}")
    t1, budget = time.monotonic(), cfg.minutes * 60 - (time.monotonic() - t0)  # what is left for training
    bar = tqdm(total=cfg.steps, initial=step, desc="drafter", unit="step", disable=not progress)
    if step == 0:
        _log(metrics, {"step": 0, "tokens": 0, **validate(drafted, val_items)})
    while (frac := max(step / cfg.steps, (time.monotonic() - t1) / max(budget, 1e-9))) < 1:
        # the cosine follows whichever is further along, the steps or the time budget, so that a run the budget
        # ends still ends cooled down
        lr = cfg.lr * min(1.0, (step + 1) / cfg.warmup) * 0.5 * (1 + math.cos(math.pi * frac))
        for g in opt.param_groups:
            g["lr"] = lr
        chunk = rng.sample(items, min(cfg.batch, len(items)))
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=fast):
            loss, stats = _loss(drafted, _batch(chunk, cfg.anchors, cfg.window, rng))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(drafter.parameters(), 1.0)
        opt.step()
        step += 1
        seen += sum(int(it["ids"].numel()) for it in chunk)
        bar.update(1)
        bar.set_postfix(loss=f"{loss.item():.3f}", acc1=f"{stats['acc@1']:.2f}", acc=f"{stats['accepted']:.2f}")
        if step % cfg.eval_every == 0:
            _log(metrics, {"step": step, "tokens": seen, "loss": loss.item(), **validate(drafted, val_items)})
        if step % cfg.save_every == 0:
            _save(out, drafted, opt, step, seen, cfg)
    bar.close()
    if step % cfg.eval_every:
        _log(metrics, {"step": step, "tokens": seen, **validate(drafted, val_items)})
    _save(out, drafted, opt, step, seen, cfg)
    plot_acceptance(metrics, out / "acceptance.png")
    return out / "drafter"


def _hf_base(model: Model, name: str) -> HFBackbone:
    if not isinstance(model.backbone, HFBackbone):
        raise UserError(f"{name}: a drafter's base is a Hugging Face model (Llama family), not a setdlm DiT")
    return model.backbone


def _log(path: Path, rec: dict) -> None:
    with path.open("a", encoding="utf-8") as f:
        f.write(json.dumps(rec) + "\n")


def plot_acceptance(metrics: Path, png: Path) -> Path | None:
    """Validation tokens per forward against training tokens (PNG); None without matplotlib."""
    try:
        import matplotlib  # optional extra [plot]

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    recs = [json.loads(line) for line in metrics.read_text(encoding="utf-8").splitlines() if line.strip()]
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot([r["tokens"] / 1e6 for r in recs], [r["tokens_per_forward"] for r in recs], marker="o")
    ax.set_xlabel("training tokens (millions, sequences seen)")
    ax.set_ylabel("tokens per forward (held-out, greedy)")
    ax.set_title("set drafter acceptance on the base's own outputs")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(png, dpi=120)
    plt.close(fig)
    return png
