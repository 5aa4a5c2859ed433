"""The data recipe (docs/training.md, "Your data"): read the corpus, build or reuse the tokenizer, tokenize
into rows of the context length, split off the fixed held-out rows; and the digest of those rows that a
checkpoint records, so that resuming on changed data is noticed."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from ..data import TokenDataset, Tokenizer, build_dataset, build_tokenizer, heldout_split, read_source
from ..errors import UserError
from ..evaluation import heldout_rows
from ..family import FamilyConfig
from .config import TrainConfig


@dataclass
class Setup:
    """What a run trains on: the tokenizer, the family at this context length, and the tokenized rows."""

    tokenizer: Tokenizer
    family: FamilyConfig
    train_rows: TokenDataset
    heldout_rows: TokenDataset  # the fixed held-out split the bound is measured on


def prepare_data(cfg: TrainConfig, tokenizer: Tokenizer | None = None) -> Setup:
    """Read the corpus, build (or reuse) the tokenizer, tokenize, split. Raises ``ValueError`` on bad data."""
    d = cfg.corpus
    corpus = read_source(d.data)
    if tokenizer is None:
        texts = corpus.texts or [p + c for p, c in corpus.pairs]
        tokenizer = build_tokenizer(d.tokenizer, texts, vocab_size=d.vocab_size)
    family = cfg.family_config(tokenizer.mask_token_id)
    data = build_dataset(corpus, tokenizer, d.length)
    train_idx, eval_idx = heldout_split(len(data), d.eval_fraction, max_eval=d.eval_max, seed=d.split_seed)
    return Setup(tokenizer, family, data.subset(train_idx), data.subset(eval_idx))


def data_digest(setup: Setup) -> str:
    """sha256 of the tokenized training and held-out rows (ids, padding and prompt masks): a checkpoint
    records it, so that ``--resume`` on changed data (an edited file, another tokenization) is noticed."""
    h = hashlib.sha256()
    for ds in (setup.train_rows, setup.heldout_rows):
        for t in (ds.input_ids, ds.attention_mask, ds.context_mask):
            h.update(str(tuple(t.shape)).encode())
            h.update(t.contiguous().numpy().tobytes())
    return h.hexdigest()


def check_same_data(folder: Path, recorded: str | None, setup: Setup, allow_change: bool) -> None:
    """Refuse to resume on data other than the checkpoint's (``recorded``: its training state's digest)
    unless ``allow_change``; checkpoints saved before the digest was recorded are not checked."""
    if recorded is None or allow_change:
        return
    now = data_digest(setup)
    if now != recorded:
        raise UserError(f"cannot resume: the training data changed since {folder} (sha256 of its tokenized rows "
                         f"{recorded[:12]}..., now {now[:12]}...); restore the data, or pass "
                        "allow_data_change=True to continue on the new data", fields=("allow_data_change",))


def heldout_of(training_args: dict, tokenizer: Tokenizer) -> TokenDataset:
    """The held-out rows a run evaluated on, rebuilt from its recorded training arguments."""
    cfg = TrainConfig.from_record(training_args)  # defaults for fields added since
    return heldout_rows(cfg.to_dict(), tokenizer)
