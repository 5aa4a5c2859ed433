"""The loss-weighting experiment (benchmarks/study/weighting.py): gaps counted against a hand-worked order,
lam = 1 is the library's SetDLM loss exactly, and lam < 1 moves weight off the gapped targets."""

import torch

from setdlm import objectives
from setdlm.batch import Batch
from setdlm.schedules import StaggeredSchedule
from support.models import make_model
from support.study import load


def test_gaps_count_the_masked_targets_to_the_left():
    w = load("weighting")
    # positions 0..4; position 0 is context; reveal order 0, 3, 1, 4, 2
    order = torch.tensor([[0, 3, 1, 4, 2]])
    targets = torch.tensor([[False, True, True, True, True]])
    # pos 1 (rank 2): left targets none masked -> 0; pos 2 (rank 4): left 1 revealed before -> 0
    # pos 3 (rank 1): left targets 1, 2 both later -> 2; pos 4 (rank 3): left 2 later, 1 and 3 earlier -> 1
    assert w.gaps(order, targets).tolist() == [[0, 0, 0, 2, 1]]


def test_lam_one_is_the_library_loss_and_lam_below_one_downweights_gapped_targets():
    w = load("weighting")
    torch.manual_seed(0)
    net = make_model(vocab=12)
    ids = torch.randint(4, 12, (3, 16))
    ctx = torch.zeros(3, 16, dtype=torch.bool)
    ctx[:, :3] = True
    batch = Batch(input_ids=ids, attention_mask=torch.ones_like(ctx), context_mask=ctx)
    sched = StaggeredSchedule.from_dm(16, 4, 8)
    g = torch.Generator().manual_seed(1)
    plain = objectives.setdlm_loss(net, batch, 3, sched, generator=torch.Generator().manual_seed(1))
    one = w.weighted_setdlm_loss(net, batch, 3, sched, lam=1.0, generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(one.loss, plain.loss, rtol=0, atol=1e-12)
    low = w.weighted_setdlm_loss(net, batch, 3, sched, lam=0.0, generator=g)
    inorder = (w.gaps(low.order, batch.targets) == 0) & low.mask
    assert (~inorder & low.mask).any()  # D = 4 gaps some targets
    expect = ((low.nll * inorder).sum(-1) / inorder.sum(-1)).mean()
    torch.testing.assert_close(low.loss, expect, rtol=0, atol=1e-12)
