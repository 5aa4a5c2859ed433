"""keep_clean_bos, the paper's LM1B/OWT training (issue 13 item 3): the row's BOS is first in the reveal
order, a MASK query scored by the training loss, and dropped (the first rank) from the bound; on in the
``lm1b``/``owt`` presets, carried from the authors' configs. Pinned against the authors' own values."""

import json

import pytest
import torch

from setdlm.formats.convert import load_reference, reference_family
from setdlm.family import FamilyConfig
from setdlm.masks import causal_mask
from setdlm.objectives import Batch, clean_bos, compute_loss, log_probs, setdlm_loss
from setdlm.training import TrainConfig

from support.reference_sources import FIX

V, MASK, BOS = 32, 31, 1


def _rows(B=3, L=12, seed=0):
    """setdlm's LM rows: [BOS] + text, BOS marked context (as setdlm.data packs documents); row 2 padded."""
    ids = torch.randint(2, V - 1, (B, L), generator=torch.Generator().manual_seed(seed))
    ids[:, 0] = BOS
    att = torch.ones(B, L, dtype=torch.bool)
    att[2, L - 4:] = False
    ctx = torch.zeros(B, L, dtype=torch.bool)
    ctx[:, 0] = True
    return Batch(ids, att, ctx)


def _family(keep: bool, L=12) -> FamilyConfig:
    return FamilyConfig("setdlm", length=L, mask_token_id=MASK, D=2, keep_clean_bos=keep)


def test_training_scores_bos_first_in_order(model64):
    batch = _rows()
    on = compute_loss(model64, _family(True), batch, generator=torch.Generator().manual_seed(4))
    off = compute_loss(model64, _family(False), batch, generator=torch.Generator().manual_seed(4))
    assert torch.all(on.order[:, 0] == 0)  # BOS leads the order
    assert torch.equal(on.order, off.order)  # the targets' order is sampled the same way
    assert torch.all(on.mask[:, 0]) and not off.mask[:, 0].any()  # scored only with keep_clean_bos
    # BOS's term: a MASK query at position 0 that sees nothing but itself
    logits = model64(torch.tensor([[MASK]]), torch.tensor([[0]]), causal_mask(torch.ones(1, 1, dtype=torch.bool)))
    bos_nll = -log_probs(logits[0, 0], MASK)[BOS]
    assert torch.allclose(on.nll[:, 0], bos_nll.expand(3), rtol=1e-9)
    assert torch.allclose(on.nll[:, 1:], off.nll[:, 1:], rtol=1e-9)  # nothing else changes
    n = batch.targets.sum(-1)  # (B,) targets per row, BOS excluded
    by_hand = ((off.nll.sum(-1) + bos_nll) / (n + 1)).mean()  # per-row mean over targets + BOS, then rows
    assert on.loss.item() == pytest.approx(by_hand.item(), rel=1e-12)


def test_bound_drops_the_first_rank(model64):
    batch = _rows()
    on = compute_loss(model64, _family(True), batch, train=False, generator=torch.Generator().manual_seed(4))
    off = compute_loss(model64, _family(False), batch, train=False, generator=torch.Generator().manual_seed(4))
    assert not on.mask[:, 0].any() and torch.equal(on.mask, batch.targets)
    assert on.loss.item() == pytest.approx(off.loss.item(), rel=1e-12)
    # rows without a marked BOS (the reference's LM rows: no context at all): position 0 is still first and
    # still dropped from the bound, scored in training
    bare = Batch(batch.input_ids, batch.attention_mask, torch.zeros_like(batch.context_mask))
    ev = compute_loss(model64, _family(True), bare, train=False, generator=torch.Generator().manual_seed(4))
    assert torch.all(ev.order[:, 0] == 0) and not ev.mask[:, 0].any()
    assert ev.loss.item() == pytest.approx(on.loss.item(), rel=1e-12)


def test_bos_of_a_prompt_stays_context():
    """A BOS followed by a prompt belongs to the prompt (the reference marks both context): not scored."""
    ids = torch.arange(8)[None].repeat(2, 1)
    ctx = torch.zeros(2, 8, dtype=torch.bool)
    ctx[0, :3] = True  # BOS + prompt
    ctx[1, :1] = True  # BOS alone
    first = clean_bos(Batch(ids, torch.ones(2, 8, dtype=torch.bool), ctx))
    assert first.tolist() == [[False] * 8, [True] + [False] * 7]


def test_matches_the_authors_values_when_bos_leads():
    """The fixture's row 0 was sampled with BOS at rank 0 (keep_clean_bos off, BOS a target): exactly the
    keep_clean_bos setting. With setdlm's rows (BOS context) and that order, training reproduces the
    authors' loss of the row and the bound the sum of its other 15 NLLs."""
    case = json.loads((FIX / "expected.json").read_text())["setdlm_loss_A_full"]
    backbone, fam = load_reference(FIX)
    order = torch.tensor(case["inputs"]["permutation"][:1])  # (1, 16)
    assert order[0, 0] == 0
    ids = torch.tensor(case["inputs"]["input_ids"][:1])
    ctx = torch.zeros_like(ids, dtype=torch.bool)
    ctx[0, 0] = True
    batch = Batch(ids, torch.ones_like(ctx), ctx)
    with torch.no_grad():
        out = setdlm_loss(backbone.float().eval(), batch, fam.mask_token_id, order=order, keep_clean_bos=True)
    nlls = torch.tensor(case["nll_by_rank"][0])  # (16,) by reveal rank
    assert out.loss.item() == pytest.approx(nlls.mean().item(), abs=1e-4)
    assert (out.nll[0, order[0]] - nlls).abs().max() < 1e-4
    fam.keep_clean_bos = True  # the bound: the first rank (BOS) dropped, 15 tokens
    bound = compute_loss(backbone, fam, batch, train=False, generator=torch.Generator().manual_seed(0))
    assert bound.tokens == 15 and bound.nll[0, 0] == 0


def test_presets_cli_and_reference_configs(tmp_path):
    for name in ("lm1b", "owt"):
        cfg = TrainConfig.from_preset(name, out=str(tmp_path), data=str(tmp_path))
        assert cfg.keep_clean_bos and cfg.family_config(0).keep_clean_bos
    assert not TrainConfig.from_preset("lm1b", out="x", family="bd3lm").family_config(0).keep_clean_bos
    assert not TrainConfig(out="x").family_config(0).keep_clean_bos  # tiny: off
    with pytest.raises(ValueError, match="keep_clean_bos applies to family 'setdlm' only"):
        FamilyConfig("bd3lm", length=8, mask_token_id=7, block_size=2, keep_clean_bos=True)
    from setdlm.cli.commands import build_parser

    p = build_parser()
    assert p.parse_args(["train", "--out", "o", "--keep-clean-bos"]).keep_clean_bos is True
    assert p.parse_args(["train", "--out", "o", "--preset", "lm1b", "--no-keep-clean-bos"]).keep_clean_bos is False
    assert not hasattr(p.parse_args(["train", "--out", "o"]), "keep_clean_bos")  # the preset decides
    cfg = json.loads((FIX / "config.json").read_text())
    assert not reference_family(cfg, mask_token_id=63).keep_clean_bos
    cfg["setdlm"]["keep_clean_bos"] = True
    assert reference_family(cfg, mask_token_id=63).keep_clean_bos
    assert reference_family({**cfg, "keep_clean_bos": True}, mask_token_id=63).keep_clean_bos
    with pytest.raises(ValueError, match="keep_clean_bos must be true or false"):
        reference_family({**cfg, "keep_clean_bos": "yes"}, mask_token_id=63)
