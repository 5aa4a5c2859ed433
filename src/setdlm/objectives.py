"""Training objectives and likelihood bounds of the four families (docs/method.md §2.3–2.5, §2.8).

Every objective returns a :class:`LossOutput`: the scalar training loss (with the family's own
reduction) and, for evaluation, per-token NLLs in nats at **original** positions with the mask of the
tokens they count, so that a bound over a dataset is ``Σ nll / Σ mask``:

* ``ar``     — exact next-token NLL.
* ``mdlm``   — train: mean CE over each row's masked tokens, then mean over rows (the reference's
  reduction, docs/concepts.md "Conventions"); bound: CE/t on masked tokens (1/t NELBO), summed over the
  batch and divided by its target tokens (token-weighted).
* ``bd3lm``  — two-stream ``[x0, xt]`` with the block mask, ``t`` per block, ≥1 mask per block in training
  (not in the bound, whose masks must follow ``q(x_t | x_0)``); same weights.
* ``setdlm`` — two-stream in reveal order, every target masked in the query stream, plain CE (no
  ``α'/(1−α)`` weight, docs/method.md §2.5, §7.1); loss = per-sequence mean, then mean over sequences.
  ``keep_clean_bos`` (the paper's LM1B/OWT training, docs/concepts.md "Conventions"): the row's leading
  BOS is revealed first, is a MASK query and is scored in training; the bound drops it (the first rank).
  ``ar_weight > 0`` adds, in training only, that weight times the next-token loss of the clean stream in
  position order (one more causal forward of the clean sequence, docs/method.md §2.10).

The MASK logit is never predicted (−∞ before the softmax, docs/method.md §7.16). Context tokens
(``context_mask``) are never masked and never in a loss; padding (``attention_mask`` False) is invisible.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from .backbone import Backbone
from .batch import Batch
from .errors import UserError
from .family import FamilyConfig
from .mask_rules import MaskRule, training_mask
from .schedules import LinearSchedule, StaggeredSchedule


@dataclass
class LossOutput:
    loss: Tensor  # () training loss
    nll: Tensor  # (B, L) nats per token at original positions, 0 where not counted
    mask: Tensor  # (B, L) bool, the tokens the bound counts
    order: Tensor | None = None  # (B, L) SetDLM: the reveal order used (original position of each rank)

    @property
    def nats(self) -> float:
        return float(self.nll.sum())

    @property
    def tokens(self) -> int:
        return int(self.mask.sum())


def log_probs(logits: Tensor, mask_token_id: int) -> Tensor:
    """Log-softmax in at least float32 with the MASK logit at −∞: (..., V) → (..., V)."""
    x = logits.to(torch.promote_types(logits.dtype, torch.float32))
    x = x.index_fill(-1, torch.tensor([mask_token_id], device=x.device), float("-inf"))
    return torch.log_softmax(x, dim=-1)


def _token_nll(logits: Tensor, labels: Tensor, mask_token_id: int) -> Tensor:
    """−log p(label): (B, n, V), (B, n) → (B, n)."""
    return -log_probs(logits, mask_token_id).gather(-1, labels[..., None])[..., 0]


def _per_sequence_mean(nll: Tensor, mask: Tensor) -> Tensor:
    """Mean over each row's counted tokens (0 for a row with none), then over rows."""
    per_row = (nll * mask).sum(-1) / mask.sum(-1).clamp(min=1)
    return per_row.mean()


# ---------------------------------------------------------------------------------------------------------


def ar_loss(model: Backbone, batch: Batch, mask_token_id: int) -> LossOutput:
    """Next-token NLL with a causal mask; position 0 has no prediction and is never counted."""
    x, valid = batch.input_ids, batch.attention_mask
    B, L = x.shape
    pos = torch.arange(L, device=x.device).expand(B, L)
    logits = model(x, pos, training_mask(model, MaskRule("causal", valid, unpadded=batch.unpadded)))  # (B, L, V)
    mask = batch.targets.clone()
    mask[:, 0] = False
    nll = torch.zeros(B, L, dtype=torch.promote_types(logits.dtype, torch.float32), device=x.device)
    nll[:, 1:] = _token_nll(logits[:, :-1], x[:, 1:], mask_token_id)
    nll = nll * mask
    return LossOutput(nll.sum() / mask.sum().clamp(min=1), nll, mask)


def masked_diffusion_loss(model: Backbone, batch: Batch, mask_token_id: int, schedule: LinearSchedule, *,
                          two_stream: bool, train: bool = True, t: Tensor | None = None,
                          masked: Tensor | None = None, generator: torch.Generator | None = None,
                          eps: float = 1e-3, antithetic: bool = False) -> LossOutput:
    """MDLM (``two_stream=False``, ``block_size = L``) and BD3LM (``two_stream=True``), docs/method.md §2.8.

    ``t`` (B, n_blocks) and ``masked`` (B, L) may be given explicitly (tests); otherwise sampled.
    """
    x, valid, targets = batch.input_ids, batch.attention_mask, batch.targets
    B, L = x.shape
    if t is None:
        t = schedule.sample_t(B, eps=eps, antithetic=antithetic, generator=generator, device=x.device)
    if masked is None:
        # BD3LM forces >= 1 mask per block in training only (docs/method.md §2.8): at evaluation x_t must follow
        # q(x_t | x_0), else a forced mask at small t gets the weight 1/t and the "bound" is inflated
        masked = schedule.sample_masked(targets, t, generator=generator, at_least_one=two_stream and train)
    masked = masked & targets
    xt = torch.where(masked, torch.full_like(x, mask_token_id), x)  # (B, L)
    pos = torch.arange(L, device=x.device).expand(B, L)
    if two_stream:
        ids = torch.cat([x, xt], 1)  # (B, 2L)
        blocks = pos // schedule.block_size  # (B, L): the BD3LM mask is the set mask of blocks (setdlm.masks)
        logits = model(ids, torch.cat([pos, pos], 1), training_mask(model, MaskRule("sets", valid, blocks)),
                       logits_start=L)  # (B, L, V): the xt half
    else:
        logits = model(xt, pos, training_mask(model, MaskRule("full", valid, unpadded=batch.unpadded)))  # (B, L, V)
    ce = _token_nll(logits, x, mask_token_id) * masked  # (B, L)
    t_tok = schedule.expand(t).to(ce.dtype).to(x.device)  # (B, L)
    nll = ce / t_tok  # weight −α'/(1−α) = 1/t on masked tokens, 0 elsewhere
    # training: unweighted CE, mean over each row's masked tokens then over rows (docs/method.md §2.8, as the
    # SetDLM loss); bound: token-weighted NELBO over the batch's targets
    loss = _per_sequence_mean(ce, masked) if train else nll.sum() / targets.sum().clamp(min=1)
    return LossOutput(loss, nll, targets)


@dataclass
class TwoStreamInputs:
    """The SetDLM backbone input (docs/method.md §2.3–2.4), everything in reveal order."""

    input_ids: Tensor  # (B, 2L): [x0 in reveal order | same with every target replaced by MASK]
    position_ids: Tensor  # (B, 2L): original positions, repeated for both streams
    rule: MaskRule  # the two-stream set mask by its rule (setdlm.mask_rules)
    clean: Tensor  # (B, L) x0 in reveal order (the labels of the query stream)
    targets: Tensor  # (B, L) bool, targets in reveal order
    order: Tensor  # (B, L) the permutation (original position of each rank)

    @property
    def attn_mask(self) -> Tensor:
        """(B, 1, 2L, 2L) bool: the dense mask (setdlm.masks.two_stream_set_mask)."""
        return self.rule.dense()


def clean_bos(batch: Batch) -> Tensor:
    """(B, L) bool, True at position 0 of each row whose position 0 is the reference's unprompted BOS
    (``keep_clean_bos``): a valid token that is a target or context alone (setdlm's rows mark BOS as
    context; a BOS followed by a prompt belongs to the prompt and stays unscored context)."""
    first = torch.zeros_like(batch.attention_mask)  # (B, L)
    assert batch.context_mask is not None  # Batch.__post_init__ makes it a tensor
    follows = batch.context_mask[:, 1] if batch.input_ids.shape[1] > 1 else torch.zeros_like(first[:, 0])
    first[:, 0] = batch.attention_mask[:, 0] & ~follows
    return first


def setdlm_inputs(batch: Batch, order: Tensor, mask_token_id: int, set_ids: Tensor | None = None,
                  scored: Tensor | None = None) -> TwoStreamInputs:
    """Build the two-stream input for a given reveal order, padding handled in permuted coordinates.
    ``scored`` (B, L): the tokens masked in the query stream (default the batch's targets)."""
    x, valid = batch.input_ids, batch.attention_mask
    targets = batch.targets if scored is None else scored
    x0p = x.gather(1, order)  # (B, L) clean tokens in reveal order
    valid_p = valid.gather(1, order)
    tgt_p = targets.gather(1, order)
    xtp = torch.where(tgt_p, torch.full_like(x0p, mask_token_id), x0p)  # every target masked
    if set_ids is None:  # singleton sets, one per reveal rank (setdlm.masks.setdlm_two_stream_mask)
        set_ids = torch.arange(x.shape[1], device=x.device).expand_as(x)
    rule = MaskRule("sets", valid_p, set_ids)
    return TwoStreamInputs(torch.cat([x0p, xtp], 1), torch.cat([order, order], 1), rule, x0p, tgt_p, order)


def setdlm_loss(model: Backbone, batch: Batch, mask_token_id: int, schedule: StaggeredSchedule | None = None, *,
                order: Tensor | None = None, set_ids: Tensor | None = None,
                generator: torch.Generator | None = None, keep_clean_bos: bool = False) -> LossOutput:
    """Two-stream any-order NLL in one sampled reveal order (docs/method.md §2.3–2.5).

    ``order`` (B, L): explicit permutation (tests, parity); otherwise sampled from ``schedule``.
    ``set_ids`` (B, L): optional set id per reveal rank (nondecreasing) to train with sets larger than one
    token (general set mask); default singleton sets, the paper's setting.
    ``keep_clean_bos``: the row's BOS (:func:`clean_bos`) is placed first in the order, masked in the query
    stream and scored (training's view; :func:`compute_loss` drops it from the bound).
    """
    L = batch.input_ids.shape[1]
    first = clean_bos(batch) if keep_clean_bos else torch.zeros_like(batch.attention_mask)  # (B, L)
    if order is None:  # BOS out of the shuffled targets: it leads the order like context (docs/method.md §2.2)
        if schedule is None:
            raise UserError("setdlm_loss samples the reveal order from schedule: pass schedule or order")
        order = schedule.sample_order(batch.targets & ~first, generator=generator)  # (B, L)
    scored = batch.targets | first  # (B, L)
    inp = setdlm_inputs(batch, order, mask_token_id, set_ids, scored)
    logits = model(inp.input_ids, inp.position_ids, training_mask(model, inp.rule), logits_start=L)  # (B, L, V)
    nll_p = _token_nll(logits, inp.clean, mask_token_id) * inp.targets  # (B, L) by rank
    loss = _per_sequence_mean(nll_p, inp.targets)
    nll = torch.zeros_like(nll_p).scatter(1, order, nll_p)  # back to original positions
    return LossOutput(loss, nll, scored, order)


def _ar(model: Backbone, family: FamilyConfig, batch: Batch, train: bool, *, generator, antithetic) -> LossOutput:
    return ar_loss(model, batch, family.mask_token_id)


def _setdlm(model: Backbone, family: FamilyConfig, batch: Batch, train: bool, *, generator, antithetic) -> LossOutput:
    out = setdlm_loss(model, batch, family.mask_token_id, family.schedule(), generator=generator,
                      keep_clean_bos=family.keep_clean_bos)
    if train and family.ar_weight:  # the clean stream read in position order is an AR model (§2.10)
        out.loss = out.loss + family.ar_weight * ar_loss(model, batch, family.mask_token_id).loss
    if not train:  # the bound counts the targets only: a kept BOS (the first rank) is dropped
        mask = batch.targets & ~clean_bos(batch) if family.keep_clean_bos else batch.targets
        nll = out.nll * mask  # (B, L)
        out = LossOutput(nll.sum() / mask.sum().clamp(min=1), nll, mask, out.order)
    return out


def _mdlm(model: Backbone, family: FamilyConfig, batch: Batch, train: bool, *, generator, antithetic) -> LossOutput:
    L = batch.input_ids.shape[1]
    return masked_diffusion_loss(model, batch, family.mask_token_id, LinearSchedule(L, L), two_stream=False,
                                 train=train, generator=generator, antithetic=antithetic)


def _bd3lm(model: Backbone, family: FamilyConfig, batch: Batch, train: bool, *, generator, antithetic) -> LossOutput:
    L = batch.input_ids.shape[1]
    assert family.block_size is not None  # the bd3lm family requires it (FamilyConfig.__post_init__)
    return masked_diffusion_loss(model, batch, family.mask_token_id, LinearSchedule(L, family.block_size),
                                 two_stream=True, train=train, generator=generator, antithetic=antithetic)


# the registry's Family.objective -> the loss (setdlm.family)
OBJECTIVES = {"ar": _ar, "mdlm": _mdlm, "bd3lm": _bd3lm, "setdlm": _setdlm}


def compute_loss(model: Backbone, family: FamilyConfig, batch: Batch, *, train: bool = True,
                 generator: torch.Generator | None = None, antithetic: bool = False) -> LossOutput:
    """The family's objective on a batch (its registry entry's ``objective``). ``train=False`` returns the
    likelihood bound as ``loss``."""
    L = batch.input_ids.shape[1]
    if L > family.length:
        raise UserError(f"batch length {L} exceeds the model's context length {family.length}")
    return OBJECTIVES[family.spec.objective](model, family, batch, train, generator=generator, antithetic=antithetic)
