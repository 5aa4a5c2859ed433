"""Ordering policies: docs/method.md §1.2 test vectors, reveal-time law, order structure (docs/method.md §1.3, §2.2)."""

import math

import pytest
import torch

from setdlm.schedules import LinearSchedule, StaggeredSchedule, invert_order, leading_and_trailing, sample_t


def test_spec_worked_example_L8_D2_M4():
    s = StaggeredSchedule.from_dm(8, 2, 4)
    assert s.b == pytest.approx(4 / 11, abs=1e-12)
    assert s.k == pytest.approx(0.5238095238, abs=1e-9)
    assert torch.allclose(s.loc, (7 - torch.arange(8, dtype=torch.float64)) / 11, atol=1e-15)
    t = torch.full((1, 8), 0.5, dtype=torch.float64)
    x = (t - s.loc) / s.b
    assert torch.allclose(x[0], torch.tensor([-0.375, -0.125, 0.125, 0.375, 0.625, 0.875, 1.125, 1.375],
                                             dtype=torch.float64), atol=1e-12)
    alpha = torch.tensor([1, 1, 0.932445, 0.781772, 0.598237, 0.336475, 0, 0], dtype=torch.float64)
    dalpha = torch.tensor([0, 0, -1.535046, -1.801798, -2.297991, -3.877474, 0, 0], dtype=torch.float64)
    assert torch.allclose(s.alpha(t)[0], alpha, atol=1e-6)
    assert torch.allclose(s.dalpha(t)[0], dalpha, atol=1e-6)
    # α' is the derivative of α: check against central differences inside the windows
    h = 1e-6
    fd = (s.alpha(t + h) - s.alpha(t - h)) / (2 * h)
    assert torch.allclose(fd, s.dalpha(t), atol=1e-5)


@pytest.mark.parametrize("L,D,M,b,k,b_tol,k_tol", [
    (1024, 4, 8, 0.0077595, 0.3364, 1e-6, 1e-4),
    (1024, 8, 16, 0.0153994, 0.3399, 1e-6, 1e-4),
    (1024, 16, 32, 0.0303318, 0.3469, 1e-6, 1e-4),
    (128, 4, 8, 0.0592593, 0.3581, 1e-6, 1e-4),
    (128, 8, 16, 0.1118881, 0.3875, 1e-6, 1e-4),
    (128, 16, 32, 0.2012579, 0.4504, 1e-6, 1e-4),
    (768, 4, 8, 0.010323, 0.3374, 1e-6, 1e-4),
    (768, 8, 16, 0.020434, 0.3421, 1e-6, 1e-4),
    (768, 16, 32, 0.040050, 0.3515, 1e-6, 1e-4),
    (1024, 16, 48, 0.044818, 0.2111, 1e-6, 1e-4),
])
def test_spec_table(L, D, M, b, k, b_tol, k_tol):
    s = StaggeredSchedule.from_dm(L, D, M)
    # the table prints b to 7 significant digits and k to 4 decimals
    assert abs(s.b - b) < b_tol and abs(s.k - k) < k_tol
    # closed forms of branch 3, exact in float64
    A = D / (2 * L)
    assert s.b == pytest.approx(M / (L + M - 1), rel=1e-14)
    assert s.k == pytest.approx(A / (M / (L + M - 1) - A), rel=1e-12)
    assert s.b / s.spacing == pytest.approx(M, rel=1e-12)  # b/Δ = M exactly
    assert s.budget == pytest.approx(D / 2, rel=1e-12)  # C = L·b·k/(k+1) = D/2


def test_branches():
    ar = StaggeredSchedule.from_dm(16, 1, 2)  # D = 1: k = 1, b = 1/L, binary α
    assert (ar.k, ar.b, ar.binary) == (1.0, 1 / 16, True)
    a = ar.alpha(torch.rand(5, 16, dtype=torch.float64))
    assert set(a.unique().tolist()) <= {0.0, 1.0}
    lin = StaggeredSchedule.from_dm(16, 8, 8)  # D = M ≠ 1: linear, b = D/L (not M/(L+M−1))
    assert (lin.k, lin.b) == (1.0, 0.5)
    md = StaggeredSchedule.from_dm(16, 16, 16)  # MDLM: b = 1, all offsets 0, α = 1 − t
    t = torch.rand(3, 1, dtype=torch.float64)
    assert md.b == 1 and torch.all(md.loc == 0)
    assert torch.allclose(md.alpha(t), (1 - t).expand(3, 16))
    kk = StaggeredSchedule.from_dm(64, 4, 8, k=0.5)  # k given: b = A(k+1)/k
    assert kk.b == pytest.approx(4 / 128 * 1.5 / 0.5)
    bb = StaggeredSchedule.from_dm(64, 4, 8, b=0.1)  # b given: k = A/(b − A)
    assert bb.k == pytest.approx((4 / 128) / (0.1 - 4 / 128))
    for s in (kk, bb):
        assert s.budget == pytest.approx(2.0)
    w = StaggeredSchedule(L=32, b=0.25, k=0.4)  # explicit width and shape
    assert (w.b, w.k, w.budget) == (0.25, 0.4, pytest.approx(32 * 0.25 * 0.4 / 1.4))
    with pytest.raises(ValueError, match=r"width b must lie in \(0, 1\]"):
        StaggeredSchedule(L=32, b=1.5, k=0.4)


@pytest.mark.parametrize("args,msg", [((8, 0, 4), "D must be"), ((8, 4, 2), "D .* must be <= M"),
                                       ((8, 2, 16), "M .* must be <= L"), ((0, 1, 1), "L must be")])
def test_bad_arguments(args, msg):
    with pytest.raises(ValueError, match=msg):
        StaggeredSchedule.from_dm(*args)


def _ks_stat(samples, cdf):
    x, _ = torch.sort(samples)
    n = x.numel()
    F = cdf(x)
    i = torch.arange(1, n + 1, dtype=torch.float64)
    return torch.maximum(i / n - F, F - (i - 1) / n).max().item()


@pytest.mark.parametrize("L,D,M", [(64, 4, 8), (128, 8, 16), (16, 2, 4)])
def test_reveal_time_law_ks(L, D, M):
    s = StaggeredSchedule.from_dm(L, D, M)
    g = torch.Generator().manual_seed(0)
    T = s.sample_reveal_times(400, generator=g)  # (400, L)
    assert T.dtype == torch.float64
    assert torch.all(T >= s.loc) and torch.all(T <= s.loc + s.b)
    u = ((T - s.loc) / s.b).flatten()
    n = u.numel()
    D_n = _ks_stat(u, lambda v: 1 - (1 - v).clamp(min=0) ** s.k)
    assert D_n < 1.63 / math.sqrt(n)  # KS critical value at α = 0.01
    # and the test has power: the wrong exponent is rejected
    wrong = _ks_stat(u, lambda v: 1 - (1 - v).clamp(min=0) ** (s.k * 1.2))
    assert wrong > 1.63 / math.sqrt(n)


@pytest.mark.parametrize("L,D,M", [(32, 2, 4), (64, 4, 8), (64, 8, 16), (48, 3, 5)])
def test_displacement_below_M(L, D, M):
    s = StaggeredSchedule.from_dm(L, D, M)
    g = torch.Generator().manual_seed(1)
    targets = torch.ones(2000, L, dtype=torch.bool)
    order = s.sample_order(targets, generator=g)
    # token j > i precedes i only if j − i < M
    rank = invert_order(order)
    later_first = (torch.arange(L)[None, :, None] < torch.arange(L)[None, None, :]) & \
                  (rank[:, :, None] > rank[:, None, :])  # (B, i, j): i < j but j revealed first
    gap = (torch.arange(L)[None, :] - torch.arange(L)[:, None]).expand_as(later_first[0])
    assert int(gap[later_first.any(0)].max()) < M
    assert int(gap[later_first.any(0)].max()) == M - 1  # the bound is reached
    assert not torch.equal(order, torch.arange(L).expand_as(order))  # not left to right


def test_D1_is_identity():
    s = StaggeredSchedule.from_dm(64, 1, 2)
    g = torch.Generator().manual_seed(2)
    targets = torch.ones(500, 64, dtype=torch.bool)
    assert torch.equal(s.sample_order(targets, generator=g), torch.arange(64).expand(500, 64))


def _chi2_upper(df, z=3.09):
    """Wilson–Hilferty upper quantile of χ²(df) at the normal quantile z (3.09 ≈ 0.999)."""
    return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


def test_DML_uniform_chi_square():
    L = 8
    s = StaggeredSchedule.from_dm(L, L, L)
    g = torch.Generator().manual_seed(3)
    n = 8000
    order = s.sample_order(torch.ones(n, L, dtype=torch.bool), generator=g)
    counts = torch.zeros(L, L)
    for r in range(L):
        counts[r] = torch.bincount(order[:, r], minlength=L).double()
    expected = n / L
    chi2 = ((counts - expected) ** 2 / expected).sum().item()
    df = (L - 1) * (L - 1)
    assert chi2 < _chi2_upper(df)
    # power check: a staggered schedule is far from uniform under the same statistic
    s2 = StaggeredSchedule.from_dm(L, 2, 4)
    o2 = s2.sample_order(torch.ones(n, L, dtype=torch.bool), generator=g)
    c2 = torch.stack([torch.bincount(o2[:, r], minlength=L).double() for r in range(L)])
    assert ((c2 - expected) ** 2 / expected).sum().item() > _chi2_upper(df)


def test_order_context_first_padding_last():
    s = StaggeredSchedule.from_dm(16, 2, 4)
    targets = torch.zeros(3, 16, dtype=torch.bool)
    targets[0, 4:12] = True  # context 0..3, padding 12..15
    targets[1, :] = True
    targets[2, 2:16] = True
    g = torch.Generator().manual_seed(4)
    for _ in range(50):
        order = s.sample_order(targets, generator=g)
        assert order[0, :4].tolist() == [0, 1, 2, 3]
        assert order[0, 12:].tolist() == [12, 13, 14, 15]
        assert sorted(order[0, 4:12].tolist()) == list(range(4, 12))
        assert order[2, :2].tolist() == [0, 1]
        assert sorted(order[1].tolist()) == list(range(16))
    beg, end = leading_and_trailing(targets)
    assert beg[0].tolist() == [True] * 4 + [False] * 12 and end[0].tolist() == [False] * 12 + [True] * 4


def test_seeded_orders_reproduce():
    s = StaggeredSchedule.from_dm(32, 4, 8)
    t = torch.ones(4, 32, dtype=torch.bool)
    a = s.sample_order(t, generator=torch.Generator().manual_seed(7))
    b = s.sample_order(t, generator=torch.Generator().manual_seed(7))
    assert torch.equal(a, b)


def test_linear_schedule_and_t_sampling():
    sch = LinearSchedule(16, 4)
    t = sch.sample_t(3, generator=torch.Generator().manual_seed(0))
    assert t.shape == (3, 4) and torch.all((t >= 1e-3) & (t < 1))
    assert torch.allclose(sch.alpha(t), 1 - t.repeat_interleave(4, -1))
    assert torch.all(sch.dalpha(t) == -1)
    # antithetic: one draw per stratum [i/G, (i+1)/G) of the global batch
    ta = sample_t(8, antithetic=True, eps=0.0, generator=torch.Generator().manual_seed(0))
    strata = torch.floor(ta[:, 0] * 8).long()
    assert sorted(strata.tolist()) == list(range(8))
    # masking rate follows t; at least one mask per block with at_least_one
    g = torch.Generator().manual_seed(5)
    targets = torch.ones(4000, 16, dtype=torch.bool)
    tb = torch.full((4000, 4), 0.3, dtype=torch.float64)
    m = sch.sample_masked(targets, tb, generator=g)
    assert abs(m.double().mean().item() - 0.3) < 0.01
    tiny = torch.full((4000, 4), 1e-3, dtype=torch.float64)
    m1 = sch.sample_masked(targets, tiny, generator=g, at_least_one=True)
    assert torch.all(m1.view(4000, 4, 4).any(-1))
    ctx = targets.clone()
    ctx[:, :4] = False  # block 0 has no targets: it must stay unmasked
    m2 = sch.sample_masked(ctx, tiny, generator=g, at_least_one=True)
    assert not m2[:, :4].any() and torch.all(m2.view(4000, 4, 4)[:, 1:].any(-1))
    # block order: blocks left to right, uniform inside
    o = sch.sample_order(torch.ones(200, 16, dtype=torch.bool), generator=g)
    assert torch.equal(o.view(200, 4, 4).sort(-1).values, torch.arange(16).view(1, 4, 4).expand(200, 4, 4))
    with pytest.raises(ValueError, match="multiple of the block size"):
        LinearSchedule(10, 4)
