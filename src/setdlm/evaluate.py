"""Evaluation of a model on data (SPEC.md §5).

``likelihood`` — the family's likelihood bound over a split (SPEC §5.1): the model in eval mode, the
training-time inputs (for SetDLM every target masked, one reveal order sampled per sequence), per-token NLLs
summed over the whole split and divided by the number of scored tokens (``Σ nll / Σ tokens``, not a mean of
batch means). AR gives its exact NLL; MDLM and BD3LM their 1/t-weighted NELBO; SetDLM the any-order NLL in
the sampled order, an upper bound on the NLL. ``samples = k`` passes over the data k times with fresh orders
(the reference's ``num_importance_samples``): the estimate's variance falls, its expectation does not move.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import torch
from tqdm.auto import tqdm

from .lm import Model
from .metrics import LikelihoodSummary
from .objectives import Batch, compute_loss


def _as_batch(b) -> Batch:
    """A ``Batch``, or a (B, L) tensor of token ids that are all scored (no padding, no context)."""
    if isinstance(b, Batch):
        return b
    if isinstance(b, torch.Tensor) and b.dim() == 2 and not b.is_floating_point():
        return Batch(b, torch.ones_like(b, dtype=torch.bool))
    raise ValueError(f"a batch must be a setdlm.objectives.Batch or a (B, L) integer tensor, got {type(b).__name__}")


@torch.no_grad()
def likelihood(model: Model, batches: Iterable, *, samples: int = 1, seed: int = 1,
               progress: bool = True) -> LikelihoodSummary:
    """Likelihood bound of ``model`` over ``batches`` (``Batch`` objects or (B, L) token-id tensors).

    ``samples``: passes over the data, each with freshly sampled orders / masks (``batches`` must then be
    re-iterable, e.g. a list or a DataLoader). ``seed`` seeds the one generator used for all of them, so
    the result is reproducible (SPEC §5.1 uses seed 1).
    """
    if samples < 1:
        raise ValueError(f"samples must be >= 1, got {samples}")
    if samples > 1 and isinstance(batches, Iterator):
        raise ValueError("samples > 1 passes over the data several times: give a list or a DataLoader, "
                         "not a one-shot iterator")
    was_training = model.backbone.training
    model.backbone.eval()
    device = next(model.backbone.parameters()).device
    generator = torch.Generator(device=device).manual_seed(seed)
    pass_nats, pass_tokens = [], []
    total = samples * len(batches) if hasattr(batches, "__len__") else None
    try:
        with tqdm(total=total, desc="likelihood", unit="batch", disable=not progress) as bar:
            for _ in range(samples):
                nats, tokens = 0.0, 0
                for b in batches:
                    out = compute_loss(model.backbone, model.family, _as_batch(b).to(device), train=False,
                                       generator=generator)
                    nats += float(out.nll.double().sum())  # (B, L) nats, 0 where not counted
                    tokens += out.tokens
                    bar.update(1)
                    seen = sum(pass_tokens) + tokens
                    if seen:
                        bar.set_postfix(nats_per_token=f"{(sum(pass_nats) + nats) / seen:.4f}")
                pass_nats.append(nats)
                pass_tokens.append(tokens)
    finally:
        model.backbone.train(was_training)
    if pass_tokens[0] == 0:
        raise ValueError("no scored tokens in the data (empty batches, or every token padding or context)")
    if len(set(pass_tokens)) > 1:
        raise ValueError(f"the data changed between passes: scored tokens per pass {pass_tokens}")
    return LikelihoodSummary(nats=sum(pass_nats) / samples, tokens=pass_tokens[0], samples=samples)
