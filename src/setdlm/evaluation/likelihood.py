"""The likelihood task: the family's likelihood bound over a split (docs/method.md §5.1), and a checkpoint's
bound on its run's held-out rows or on given text, with the run's recorded evaluation settings.

:func:`likelihood` is the one estimator, behind ``setdlm eval``, the trainer's held-out bound and the lm-eval
adapter's scores: the model in eval mode, the training-time inputs (for SetDLM every target masked, one
reveal order sampled per sequence), per-token NLLs summed over the whole split and divided by the number of
scored tokens (``Σ nll / Σ tokens``, not a mean of batch means). AR gives its exact NLL; MDLM and BD3LM their
1/t-weighted NELBO; SetDLM the any-order NLL in the sampled order, an upper bound on the NLL. ``samples = k``
passes over the data k times with fresh orders (the reference's ``num_importance_samples``): the estimate's
variance falls, its expectation does not move. The task does not decode: it measures a checkpoint
(:func:`checkpoint_likelihood`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Sequence, Sized
from contextlib import nullcontext
from pathlib import Path
from typing import cast

import torch
from tqdm.auto import tqdm

from ..backbone import Backbone
from ..batch import Batch
from ..data import build_dataset, read_source
from ..data.dataset import TokenDataset, heldout_split
from ..errors import UserError
from ..formats.checkpoint import read_config
from ..formats.layout import is_checkpoint
from ..formats.loading import locate
from ..lm import Model
from ..objectives import compute_loss
from ..seeds import derive_seed
from .metrics import LikelihoodSummary
from .registry import Task, register


def _as_batch(b) -> Batch:
    """A ``Batch``, or a (B, L) tensor of token ids that are all scored (no padding, no context)."""
    if isinstance(b, Batch):
        return b
    if isinstance(b, torch.Tensor) and b.dim() == 2 and not b.is_floating_point():
        return Batch(b, torch.ones_like(b, dtype=torch.bool))
    raise UserError(f"a batch must be a setdlm.objectives.Batch or a (B, L) integer tensor, got {type(b).__name__}")


def bound_generator(seed: int, sample: int, index: int, device=None) -> torch.Generator:
    """The generator of batch ``index`` in pass ``sample`` of :func:`likelihood`: seeded by ``(seed, index)``
    in the first pass (the trainer's held-out seeds) and by ``(seed, sample, index)`` in later ones, so that
    a batch's orders and masks depend neither on the batches before it nor on the number of processes."""
    parts = (seed, "eval", index) if sample == 0 else (seed, "eval", sample, index)
    return torch.Generator(device=device).manual_seed(derive_seed(*parts))


def _indexed(batches, rank: int, world: int) -> Iterator[tuple[int, object]]:
    """``(index, batch)`` of the batches this process scores: every ``world``-th from ``rank``."""
    if isinstance(batches, Sequence):
        return ((i, batches[i]) for i in range(rank, len(batches), world))
    return ((i, b) for i, b in enumerate(batches) if i % world == rank)


@torch.no_grad()
def likelihood(model: Model, batches: Iterable, *, samples: int = 1, seed: int = 1, bf16: bool = False,
               dist=None, progress: bool = True) -> LikelihoodSummary:
    """Likelihood bound of ``model`` over ``batches`` (``Batch`` objects or (B, L) token-id tensors): the
    one estimator behind ``setdlm eval``, the trainer's held-out bound
    (:meth:`setdlm.training.state.TrainState.evaluate`)
    and the lm-eval adapter's scores.

    ``samples``: passes over the data, each with freshly sampled orders / masks (``batches`` must then be
    re-iterable, e.g. a list or a DataLoader). Batch ``i`` of pass ``s`` draws them from
    :func:`bound_generator` ``(seed, s, i)``, so the result is reproducible (docs/method.md §5.1: seed 1) and
    does not depend on the batches before it. ``bf16``: autocast. ``dist`` (a
    :class:`setdlm.training.distributed.Dist`):
    under DDP each process scores every ``world``-th batch and the sums are all-reduced.
    """
    if samples < 1:
        raise UserError(f"samples must be >= 1, got {samples}")
    if samples > 1 and isinstance(batches, Iterator):
        raise UserError("samples > 1 passes over the data several times: give a list or a DataLoader, "
                        "not a one-shot iterator")
    rank, world = (dist.rank, dist.world) if dist is not None else (0, 1)
    backbone = cast(Backbone, model.backbone)  # Model.backbone: any nn.Module that honours the protocol
    was_training = model.backbone.training
    model.backbone.eval()
    device = next(model.backbone.parameters()).device
    sums = torch.zeros(samples, 4, dtype=torch.float64, device=device)  # per pass: nats, tokens, Σ bounds, batches
    total = samples * -(-(len(batches) - rank) // world) if isinstance(batches, Sized) else None
    amp = torch.autocast(device.type, dtype=torch.bfloat16) if bf16 else nullcontext()
    try:
        with tqdm(total=total, desc="likelihood", unit="batch", disable=None if progress else True) as bar, amp:
            for s in range(samples):
                for i, b in _indexed(batches, rank, world):
                    out = compute_loss(backbone, model.family, _as_batch(b).to(device), train=False,
                                       generator=bound_generator(seed, s, i, device))
                    sums[s] += torch.stack([out.nll.double().sum(), out.mask.sum().double(), out.loss.double(),
                                            torch.ones((), dtype=torch.float64, device=device)])
                    bar.update(1)
                    if not bar.disable and sums[:, 1].sum() > 0:  # reading the sums waits for the device
                        bar.set_postfix(nats_per_token=f"{float(sums[:, 0].sum() / sums[:, 1].sum()):.4f}")
    finally:
        model.backbone.train(was_training)
    if dist is not None and dist.active:
        torch.distributed.all_reduce(sums)
    nats, tokens, bounds, count = sums.cpu().unbind(-1)  # (samples,) each
    if tokens[0] == 0:
        raise UserError("no scored tokens in the data (empty batches, or every token padding or context)")
    if len(set(tokens.tolist())) > 1:
        raise UserError(f"the data changed between passes: scored tokens per pass {[int(t) for t in tokens]}")
    return LikelihoodSummary(nats=float(nats.sum()) / samples, tokens=int(tokens[0]), samples=samples,
                             batch_mean=float(bounds.sum() / count.sum()))


# the training arguments that rebuild a run's held-out rows (every setdlm checkpoint records them)
SPLIT_ARGS = ("data", "length", "eval_fraction", "eval_max", "split_seed")


def training_args(checkpoint: str | Path) -> dict:
    """The training arguments a checkpoint recorded ({} for one that has none, e.g. the authors' layout)."""

    folder = locate(checkpoint)
    return (read_config(folder).get("training") or {}) if is_checkpoint(folder) else {}


def heldout_rows(training: dict, tokenizer) -> TokenDataset:
    """The held-out rows a run evaluated on, rebuilt from its recorded training arguments ``training``:
    its text source tokenized into rows of its context length, then the trainer's fixed split
    (:func:`setdlm.data.dataset.heldout_split`)."""

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


def _measure(model: Model, checkpoint, spec, *, batch_size: int | None, bf16: bool) -> dict:
    """The task's result for ``checkpoint``: :func:`checkpoint_likelihood` on ``spec.data`` or the run's rows."""
    return checkpoint_likelihood(model, training_args(checkpoint), data=spec.data, batch_size=batch_size,
                                 seed=spec.seed, bf16=bf16, where=str(checkpoint))


LIKELIHOOD = register(Task(
    name="likelihood", title="the likelihood bound", quality="nelbo", header="nats/token",
    source=lambda spec: "each run's held-out rows", options=("bf16",), percent=False, measure=_measure,
    notes={"data": "text source (default: the run's held-out rows)"}))
