"""Training presets by name (docs/method.md §2.9 for the paper's sizes).

A preset is a set of :class:`setdlm.training.TrainConfig` values; anything given on the command line (or as a
keyword to ``TrainConfig.from_preset``) overrides it.

==========  ======================================================================================
``tiny``    the ``TrainConfig`` defaults: characters, L=64, d=64, 2 layers, 2 heads; seconds on a CPU
``quick``   the README's quick start: byte-level BPE (512), L=64, d=128, 2 layers, 4 heads, 600 steps of 32
            rows at a cosine 3e-3; under two minutes on 2 CPU cores, and its first text has Shakespeare's
            words and shape (speaker lines, "my lord", "I'll"), not yet its sense
``small``   the probe size: byte-level BPE (4096), L=128, d=256, 4 layers, 4 heads (≈5.3 M parameters)
``lm1b``    the paper's LM1B DiT: bert-base-uncased, L=128, d=768, 12 layers, 12 heads, dropout 0.1,
            batch 512, lr 3e-4 constant after 2500 warm-up steps, betas (0.9, 0.999), no weight
            decay, EMA 0.9999, bf16, 1M steps, D=4 (M=8), BD3LM S=4; SetDLM with ``keep_clean_bos``
            (BOS first in the order and scored in training, as the authors trained)
``owt``     the paper's OpenWebText DiT: gpt2 tokenizer (+MASK), L=1024, otherwise as ``lm1b``, D=8
            (M=16), BD3LM S=8
==========  ======================================================================================

The paper's CNN/DM and GSM8K runs use Qwen3 backbones (docs/method.md §2.9); those go through the Hugging Face
adapter, not these presets. ``lm1b``/``owt`` fetch their tokenizer from the Hub (``hf:NAME``): pass
``--tokenizer FOLDER`` to use a local copy instead.
"""

from __future__ import annotations

from .errors import UserError

_PAPER_DIT = dict(hidden_size=768, n_layers=12, n_heads=12, dropout=0.1, batch_size=512, lr=3e-4, warmup=2500,
                  lr_schedule="constant", beta1=0.9, beta2=0.999, weight_decay=0.0, clip=1.0, ema=0.9999,
                  bf16=True, steps=1_000_000, eval_every=10_000, save_every=10_000, eval_batch_size=16,
                  eval_max=4096)

PRESETS: dict[str, dict] = {
    "tiny": {},
    "quick": dict(tokenizer="bpe", vocab_size=512, length=64, hidden_size=128, n_layers=2, n_heads=4, batch_size=32,
                  steps=600, lr=3e-3, warmup=40, lr_schedule="cosine", eval_every=0, save_every=0, eval_max=64,
                  log_every=100),
    "small": dict(tokenizer="bpe", vocab_size=4096, length=128, hidden_size=256, n_layers=4, n_heads=4,
                  batch_size=32, steps=5000, lr=1e-3, warmup=200, eval_every=500, save_every=500,
                  eval_batch_size=32, eval_max=512, D=4, block_size=4),
    "lm1b": dict(_PAPER_DIT, tokenizer="hf:bert-base-uncased", length=128, D=4, block_size=4, keep_clean_bos=True),
    "owt": dict(_PAPER_DIT, tokenizer="hf:gpt2", length=1024, D=8, block_size=8, keep_clean_bos=True),
}


def preset(name: str) -> dict:
    if name not in PRESETS:
        raise UserError(f"unknown preset {name!r}; choose one of {', '.join(PRESETS)}")
    return dict(PRESETS[name])
