"""Ordering policies: which positions are revealed when (docs/method.md §1, §2.1, §2.2).

Every family is a transformer plus one of these policies:

* ``StaggeredSchedule`` — the position-offset ("staggered") schedule of SetDLM (docs/method.md §1.1–1.3). Each
  position ``i`` has survival ``α_i(t) = (1 − x)^k`` inside a time interval of width ``b`` starting at offset
  ``loc_i = (1 − b)(L − 1 − i)/(L − 1)``, ``x = (t − loc_i)/b``. Reveal times ``T_i`` are sampled by inverse
  CDF; the order is ``argsort(T)`` descending with context first and padding last. D = 1 gives AR,
  D = M = L gives a uniformly random order (MDLM / AO-ARM).
* ``LinearSchedule`` — ``α = 1 − t`` with one ``t`` per block of ``block_size`` tokens: BD3LM (docs/method.md §2.8);
  ``block_size = L`` is MDLM (one ``t`` per sequence).
* AR needs no policy: its order is the identity (left to right).

All randomness goes through an optional ``torch.Generator`` so that orders reproduce.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from torch import Tensor

from .errors import UserError

_EPS64 = torch.finfo(torch.float64).eps


# ---------------------------------------------------------------------------------------------------------
# time sampling (docs/method.md §2.1)
# ---------------------------------------------------------------------------------------------------------


def sample_t(
    batch: int,
    n_blocks: int = 1,
    *,
    eps: float = 1e-3,
    antithetic: bool = False,
    generator: torch.Generator | None = None,
    global_batch: int | None = None,
    global_offset: int = 0,
    device: torch.device | str | None = None,
) -> Tensor:
    """Diffusion times ``t = (1 − eps)·u + eps``, ``u ~ U[0, 1)``, one per (example, block): ``(B, n_blocks)``.

    With ``antithetic=True`` the draws are stratified over the (global) batch as in docs/method.md §2.1:
    ``u ← (u/G + idx/G) mod 1`` where ``G`` is the global batch size and ``idx`` the global example index
    (``global_offset + row``), so that each example covers its own 1/G slice of [0, 1).
    """
    if batch < 1 or n_blocks < 1:
        raise UserError(f"sample_t needs batch >= 1 and n_blocks >= 1, got batch={batch}, n_blocks={n_blocks}")
    u = torch.rand(batch, n_blocks, generator=generator, dtype=torch.float64, device=device)  # (B, nb)
    if antithetic:
        g = global_batch or batch
        idx = torch.arange(global_offset, global_offset + batch, dtype=torch.float64, device=u.device)
        u = torch.remainder(u / g + idx[:, None] / g, 1.0)
    return (1.0 - eps) * u + eps


# ---------------------------------------------------------------------------------------------------------
# orders
# ---------------------------------------------------------------------------------------------------------


def leading_and_trailing(targets: Tensor) -> tuple[Tensor, Tensor]:
    """Positions before the first target (``is_beginning``) and after the last one (``is_end``), per row.

    ``targets``: (B, L) bool. A row without targets is all ``is_beginning`` (nothing to order).
    """
    L = targets.shape[-1]
    idx = torch.arange(L, device=targets.device)
    any_t = targets.any(-1, keepdim=True)  # (B, 1)
    first = torch.where(targets, idx, L).min(-1, keepdim=True).values  # (B, 1)
    last = torch.where(targets, idx, -1).max(-1, keepdim=True).values  # (B, 1)
    is_beginning = (idx < first) | ~any_t
    is_end = (idx > last) & any_t
    return is_beginning, is_end


def order_from_times(times: Tensor, targets: Tensor) -> Tensor:
    """Stable argsort of reveal times, descending, with the leading context first (``+∞``) and trailing
    padding last (``−∞``) in their original order (docs/method.md §2.2). ``times``: (B, L) float64 → (B, L) long."""
    is_beginning, is_end = leading_and_trailing(targets)
    t = times.masked_fill(is_beginning, math.inf).masked_fill(is_end, -math.inf)
    return torch.sort(t, dim=-1, descending=True, stable=True).indices


def invert_order(order: Tensor) -> Tensor:
    """Rank of each position: ``rank[b, order[b, r]] = r``. (B, L) → (B, L)."""
    rank = torch.empty_like(order)
    rank.scatter_(-1, order, torch.arange(order.shape[-1], device=order.device).expand_as(order))
    return rank


# ---------------------------------------------------------------------------------------------------------
# the position-offset schedule (docs/method.md §1)
# ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StaggeredSchedule:
    """Position-offset schedule with width ``b`` and shape ``k`` over ``L`` positions (docs/method.md §1.1).

    ``b`` is a float in (0, 1]: the width, in time, of the interval in which a position is masked (not the
    decoding ``window``, an integer count of positions, docs/method.md §4.2). Build it with :meth:`from_dm`
    (target parallelism ``D``, max set size ``M``, branch logic of docs/method.md §1.2) or directly as
    ``StaggeredSchedule(L=, b=, k=)``.
    """

    L: int
    b: float
    k: float
    D: int | None = None
    M: int | None = None
    binary: bool = False  # D == 1: masking probabilities snapped to {0, 1} (docs/method.md §1.1, AR special case)
    loc: Tensor = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        if self.L < 1:
            raise UserError(f"schedule length L must be >= 1, got {self.L}")
        if not (0.0 < self.b <= 1.0):
            raise UserError(f"width b must lie in (0, 1], got {self.b}")
        if not (self.k > 0 and math.isfinite(self.k)):
            raise UserError(f"shape k must be positive and finite, got {self.k}")
        L = self.L
        i = torch.arange(L, dtype=torch.float64)
        loc = (1.0 - self.b) * (L - 1 - i) / (L - 1) if L > 1 else torch.zeros(1, dtype=torch.float64)
        object.__setattr__(self, "loc", loc)  # (L,) float64, decreasing with position

    # -- construction --------------------------------------------------------------------------------------

    @classmethod
    def from_dm(cls, L: int, D: int, M: int | None = None, *, k: float | None = None,
                b: float | None = None) -> StaggeredSchedule:
        """docs/method.md §1.2: ``A = D/(2L)``; k given → ``b = A(k+1)/k``; else b given → ``k = A/(b − A)``;
        else ``D ∉ {1, M}`` → ``b = M/(L + M − 1)``, ``k = A/(b − A)``; else ``k = 1``, ``b = D/L``."""
        M = 2 * D if M is None else M
        for name, v in (("L", L), ("D", D), ("M", M)):
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise UserError(f"{name} must be a positive integer, got {v!r}")
        if D > M:
            raise UserError(f"D (target parallelism) must be <= M (max set size), got D={D}, M={M}")
        if M > L:
            raise UserError(f"M (max set size) must be <= L (context length), got M={M}, L={L}")
        A = D / (2 * L)
        if k is not None:
            b = A * (k + 1) / k
        elif b is not None:
            if b <= A:
                raise UserError(f"width b={b} must exceed the desired area D/(2L)={A}")
            k = A / (b - A)
        elif D not in (1, M):
            b = M / (L + M - 1)
            k = A / (b - A)
        else:
            k, b = 1.0, 2 * A
        if not b <= 1.0 + 1e-12:
            raise UserError(f"schedule width b={b} > 1 for L={L}, D={D}, M={M}, k={k}")
        if abs(b * k / (k + 1) - A) >= 1e-6:
            raise UserError(f"schedule area b·k/(k+1)={b * k / (k + 1)} does not match D/(2L)={A}")
        return cls(L=L, b=min(b, 1.0), k=float(k), D=D, M=M, binary=(D == 1))

    # -- derived quantities ------------------------------------------------------------------------------------

    @property
    def spacing(self) -> float:
        """Offset spacing Δ = (1 − b)/(L − 1); ``b/Δ = M`` in the normal SetDLM branch."""
        return (1.0 - self.b) / (self.L - 1) if self.L > 1 else 1.0

    @property
    def budget(self) -> float:
        """Expected number of active (masked, inside their interval) tokens: ``C = L·b·k/(k+1)`` (= D/2)."""
        return self.L * self.b * self.k / (self.k + 1)

    def _x(self, t: Tensor) -> Tensor:
        t = torch.as_tensor(t, dtype=torch.float64)
        loc = self.loc.to(t.device)[-t.shape[-1]:] if t.dim() > 0 and t.shape[-1] != 1 else self.loc.to(t.device)
        return (t - loc) / self.b  # (..., L)

    def move_chance(self, t: Tensor) -> Tensor:
        """Masking probability ``m_i(t) = 1 − (1 − x)^k`` clipped to [0, 1]; ``t`` broadcasts to (..., L)."""
        x = self._x(t)
        xc = x.clamp(0.0, 1.0 - _EPS64)
        m = -torch.expm1(self.k * torch.log1p(-xc))
        m = torch.where(x >= 1.0, torch.ones_like(m), m)
        if self.binary:
            m = (m > 0).to(m.dtype)
        return m

    def alpha(self, t: Tensor) -> Tensor:
        """Survival probability ``α_i(t) = 1 − m_i(t)``: (..., L) float64."""
        return 1.0 - self.move_chance(t)

    def dalpha(self, t: Tensor) -> Tensor:
        """Time derivative ``α'_i(t) = −(k/b)(1 − x)^{k−1}`` for ``0 < x ≤ 1``, else 0: (..., L) float64."""
        x = self._x(t)
        xc = x.clamp(0.0, 1.0 - _EPS64)
        d = -(self.k / self.b) * torch.exp((self.k - 1.0) * torch.log1p(-xc))
        return torch.where((x > 0) & (x <= 1), d, torch.zeros_like(d))

    # -- sampling ------------------------------------------------------------------------------------------

    def sample_reveal_times(self, batch: int, length: int | None = None, *,
                            generator: torch.Generator | None = None, device=None) -> Tensor:
        """First-hitting times ``T_i = loc_i + b(1 − e^{−E/k})``, ``E ~ Exp(1)`` (docs/method.md §1.3), float64.

        ``length < L`` uses the last ``length`` offsets. Returns (B, length).
        """
        n = self.L if length is None else length
        if not 1 <= n <= self.L:
            raise UserError(f"cannot sample {n} reveal times from a schedule of length {self.L}")
        E = torch.empty(batch, n, dtype=torch.float64, device=device).exponential_(generator=generator)
        loc = self.loc.to(E.device)[self.L - n:]  # (n,)
        return loc + self.b * (-torch.expm1(-E / self.k))  # (B, n)

    def sample_order(self, targets: Tensor, *, generator: torch.Generator | None = None,
                     return_times: bool = False):
        """Reveal order for a batch (docs/method.md §2.2). ``targets``: (B, L) bool, True where the token is to be
        generated. Offsets are indexed by absolute position (the row length must be ``L``; shorter rows use
        the last offsets). Returns the permutation (B, L) long (and the sorted times if asked)."""
        B, n = targets.shape
        T = self.sample_reveal_times(B, n, generator=generator, device=targets.device)  # (B, n)
        order = order_from_times(T, targets)
        if return_times:
            return order, T.gather(-1, order)
        return order


# ---------------------------------------------------------------------------------------------------------
# block-linear schedule: BD3LM (block S) and MDLM (block L)  (docs/method.md §1.5, §2.8)
# ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LinearSchedule:
    """``α = 1 − t`` with one ``t`` per block of ``block_size`` positions; ``block_size = L`` is MDLM."""

    L: int
    block_size: int

    def __post_init__(self):
        if self.L < 1 or self.block_size < 1:
            raise UserError(f"L and block_size must be >= 1, got L={self.L}, block_size={self.block_size}")
        if self.block_size > self.L:
            raise UserError(f"block size {self.block_size} exceeds the context length L={self.L}")
        if self.L % self.block_size:
            raise UserError(f"context length L={self.L} must be a multiple of the block size {self.block_size}")

    @property
    def n_blocks(self) -> int:
        return self.L // self.block_size

    def block_ids(self, device=None) -> Tensor:
        """Block index of each position: (L,) long."""
        return torch.arange(self.L, device=device) // self.block_size

    def sample_t(self, batch: int, **kw) -> Tensor:
        """Per-block times (B, n_blocks); see :func:`sample_t` for the keywords."""
        return sample_t(batch, self.n_blocks, **kw)

    def expand(self, t_blocks: Tensor) -> Tensor:
        """Per-block values (B, n_blocks) → per-position (B, L)."""
        return t_blocks.repeat_interleave(self.block_size, dim=-1)

    def alpha(self, t_blocks: Tensor) -> Tensor:
        """Survival ``1 − t`` per position: (B, L)."""
        return 1.0 - self.expand(t_blocks)

    def dalpha(self, t_blocks: Tensor) -> Tensor:
        """``α' = −1`` per position: (B, L)."""
        return -torch.ones_like(self.expand(t_blocks))

    def sample_masked(self, targets: Tensor, t_blocks: Tensor, *, generator: torch.Generator | None = None,
                      at_least_one: bool = False) -> Tensor:
        """Which targets are MASK in ``x_t``: each independently with probability ``t`` of its block.

        ``at_least_one`` (BD3LM, docs/method.md §2.8): a block that has targets but drew no mask gets one target,
        chosen uniformly, masked. ``targets`` (B, L) bool → (B, L) bool.
        """
        B, L = targets.shape
        p = self.expand(t_blocks).to(targets.device)  # (B, L)
        u = torch.rand(B, L, generator=generator, dtype=torch.float64, device=targets.device)
        masked = (u < p) & targets
        if at_least_one:
            nb, S = self.n_blocks, self.block_size
            tb = targets.view(B, nb, S)
            empty = tb.any(-1) & ~masked.view(B, nb, S).any(-1)  # (B, nb)
            if empty.any():
                # pick one target per empty block: the target with the largest uniform score
                score = torch.rand(B, nb, S, generator=generator, device=targets.device)
                score = score.masked_fill(~tb, -1.0)
                pick = torch.zeros_like(tb).scatter_(-1, score.argmax(-1, keepdim=True), True)
                masked = masked | (pick & empty[..., None]).view(B, L)
        return masked

    def sample_order(self, targets: Tensor, *, generator: torch.Generator | None = None) -> Tensor:
        """Blocks left to right, uniform order inside each block (docs/method.md §1.4, ``LinearNoise``): (B, L)."""
        B, L = targets.shape
        u = torch.rand(B, L, generator=generator, dtype=torch.float64, device=targets.device)
        times = (self.n_blocks - self.block_ids(targets.device)).to(torch.float64) - u  # (B, L) decreasing by block
        return order_from_times(times, targets)
