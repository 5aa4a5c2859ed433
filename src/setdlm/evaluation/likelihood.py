"""A checkpoint's likelihood bound on its run's held-out rows or on given text: the one estimator,
:func:`setdlm.evaluate.likelihood` (docs/method.md §5.1), with the run's recorded evaluation settings."""

from __future__ import annotations

import math
from pathlib import Path

from ..data.dataset import TokenDataset
from ..errors import UserError
from ..lm import Model

# the training arguments that rebuild a run's held-out rows (every setdlm checkpoint records them)
SPLIT_ARGS = ("data", "length", "eval_fraction", "eval_max", "split_seed")


def training_args(checkpoint: str | Path) -> dict:
    """The training arguments a checkpoint recorded ({} for one that has none, e.g. the authors' layout)."""
    from ..formats.checkpoint import is_checkpoint, read_config
    from ..formats.loading import locate

    folder = locate(checkpoint)
    return (read_config(folder).get("training") or {}) if is_checkpoint(folder) else {}


def heldout_rows(training: dict, tokenizer) -> TokenDataset:
    """The held-out rows a run evaluated on, rebuilt from its recorded training arguments ``training``:
    its text source tokenized into rows of its context length, then the trainer's fixed split
    (:func:`setdlm.data.dataset.heldout_split`)."""
    from ..data import build_dataset, read_source
    from ..data.dataset import heldout_split

    missing = [k for k in SPLIT_ARGS if k not in training]
    if missing:
        raise UserError(f"the run records no {', '.join(missing)}: its held-out rows cannot be rebuilt; evaluate "
                        "on a text source instead")
    try:
        source = read_source(training["data"])
    except UserError:  # e.g. a file of the machine that trained it
        raise UserError(f"the run's held-out rows come from the text it trained on, {training['data']!r}, which "
                        "cannot be read here: pass data (a file, folder or built-in corpus) to evaluate on other text",
                        fields=("data",)) from None
    rows = build_dataset(source, tokenizer, training["length"])
    _, index = heldout_split(len(rows), training["eval_fraction"], max_eval=training["eval_max"],
                             seed=training["split_seed"])
    return rows.subset(index)


def checkpoint_likelihood(model: Model, training: dict, *, data: str | None = None, batch_size: int | None = None,
                          seed: int | None = None, bf16: bool = False, where: str = "the checkpoint") -> dict:
    """The family's likelihood bound on ``data`` (a text source, every row) or, when None, on the held-out
    rows of the run that ``training`` (:func:`training_args`) describes, as a dict: ``nelbo`` (nats per
    token), ``ppl``, ``bpd``, ``tokens`` and ``loss`` (the mean of the per-batch bounds). Unset
    ``batch_size``/``seed``/``bf16`` default to the run's own evaluation settings, so the bound is the one
    the trainer logged."""
    from ..data import build_dataset, read_source
    from ..evaluate import likelihood

    if data is not None:
        rows = build_dataset(read_source(data), model.tokenizer, model.family.length)
    elif training:
        rows = heldout_rows(training, model.tokenizer)
    else:
        raise UserError(f"{where} records no training run (its held-out rows): pass data", fields=("data",))
    if len(rows) == 0:
        raise UserError("no rows to evaluate", fields=("data",))
    res = likelihood(model, rows.batches(batch_size or training.get("eval_batch_size", 16)),
                     seed=training.get("eval_seed", 1) if seed is None else seed,
                     bf16=bf16 or bool(training.get("bf16", False)), progress=True)
    nelbo = res.nats_per_token
    return {"task": "likelihood", "family": model.family.family, "nelbo": nelbo, "ppl": math.exp(min(nelbo, 700)),
            "bpd": nelbo / math.log(2), "tokens": res.tokens, "loss": res.batch_mean}
