"""Training masks as rules, for FlexAttention (docs/training.md, "Attention kernels").

The objectives' masks (:mod:`setdlm.masks`) are dense booleans, (B, 1, n, n) for one stream and
(B, 1, 2L, 2L) for the two-stream SetDLM and BD3LM inputs: on a GPU that is B·4L² bytes built every step,
and SDPA with a dense boolean mask runs its memory-efficient kernel over every block, visible or not. A
:class:`MaskRule` is the same mask given by its rule (padding per slot, and for two streams a set id per
slot), from which :func:`attention` picks the kernel:

=====================================  ====================================================================
the rule                               kernel
=====================================  ====================================================================
causal, no padding                     SDPA with ``is_causal=True`` (the flash kernel a plain loop uses)
full attention, no padding             SDPA without a mask
anything else, on CUDA                 ``flex_attention`` with a ``BlockMask`` built from :meth:`MaskRule.mask_mod`
                                       (blocks nobody sees are skipped: the two-stream mask is ~3/4 empty)
anything else, on the CPU              SDPA with the dense mask of :mod:`setdlm.masks` (exactly as before)
=====================================  ====================================================================

``mask_mod(b, h, q, k)`` is the dense mask's entry, written as the set rule of :func:`setdlm.masks.two_stream_set_mask`;
tests check it entry by entry against :mod:`setdlm.masks` for every family, and flex_attention's output against
the dense path at float64. Rows with no visible key (padding queries) come out as zeros under flex and as
"see everything" under the dense path (:func:`setdlm.model.begin_step`): no loss counts them either way.

:func:`kernel` chooses the policy: ``"auto"`` (flex on CUDA, dense elsewhere), ``"flex"`` or ``"dense"``
(tests, comparisons). Only backbones that declare ``accepts_mask_rules`` receive a rule; any other
:class:`setdlm.backbone.Backbone` still gets the dense boolean mask.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import warnings
from typing import Literal

import torch
from torch import Tensor

from .errors import UserError
from .masks import bidirectional_mask, causal_mask, two_stream_set_mask

# "auto" | "flex" | "dense": a context variable, so that a block's policy holds in its own thread and task only
_POLICY: contextvars.ContextVar[str] = contextvars.ContextVar("setdlm_mask_kernel", default="auto")


@contextlib.contextmanager
def kernel(policy: str):
    """Within the block, training masks use ``policy``: ``"auto"``, ``"flex"`` or ``"dense"``."""
    if policy not in ("auto", "flex", "dense"):
        raise UserError(f"attention kernel policy must be auto, flex or dense, got {policy!r}")
    token = _POLICY.set(policy)
    try:
        yield
    finally:
        _POLICY.reset(token)


def flex_available() -> bool:
    try:
        from torch.nn.attention.flex_attention import flex_attention  # noqa: F401
    except ImportError:
        return False
    return True


def uses_rules(device: torch.device) -> bool:
    """Whether training masks on ``device`` travel as rules (else as dense booleans)."""
    p = _POLICY.get()
    return p == "flex" or (p == "auto" and device.type == "cuda" and flex_available())


class MaskRule:
    """A training mask by its rule. ``kind``: ``"causal"``, ``"full"`` (bidirectional) or ``"sets"`` (the
    two-stream ``[x0 | xt]`` set mask over ``2n`` slots); ``valid`` (B, n) bool, False on padding; ``set_ids``
    (B, n) long for ``"sets"`` (nondecreasing per row); ``unpadded``: whether ``valid`` is all True, when the
    caller knows it on the host (else read from ``valid`` once, a device sync on a GPU). A plain object, not a
    dataclass, so that wrappers that walk a forward's arguments (DDP, FSDP) pass it through untouched."""

    def __init__(self, kind: Literal["causal", "full", "sets"], valid: Tensor, set_ids: Tensor | None = None,
                 unpadded: bool | None = None):
        if kind not in ("causal", "full", "sets") or (kind == "sets") != (set_ids is not None):
            raise ValueError(f"MaskRule: kind {kind!r} with{'out' if set_ids is None else ''} set ids")
        self.kind, self.valid, self.set_ids = kind, valid, set_ids
        self._cache: dict = {}  # dense / fixed masks, the block mask, "unpadded": built once per forward
        if unpadded is not None:
            self._cache["unpadded"] = unpadded

    @property
    def size(self) -> int:
        """Query (= key) slots: n for one stream, 2n for two."""
        n = self.valid.shape[-1]
        return 2 * n if self.kind == "sets" else n

    def dense(self) -> Tensor:
        """The :mod:`setdlm.masks` mask: (B, 1, size, size) bool."""
        if "dense" not in self._cache:
            if self.kind == "sets":
                assert self.set_ids is not None  # kind "sets" comes with set ids (checked in __init__)
                self._cache["dense"] = two_stream_set_mask(self.set_ids, self.valid)
            elif self.kind == "causal":
                self._cache["dense"] = causal_mask(self.valid)
            else:
                self._cache["dense"] = bidirectional_mask(self.valid)
        return self._cache["dense"]

    def fixed(self) -> Tensor:
        """:meth:`dense` with each row that sees no key seeing every key, as :func:`setdlm.model.begin_step`
        makes any mask (a row with no visible key would give NaN)."""
        if "fixed" not in self._cache:
            m = self.dense()
            self._cache["fixed"] = m | ~m.any(-1, keepdim=True)
        return self._cache["fixed"]

    def unpadded(self) -> bool:
        """No padding slot (given, or read once per forward: a host sync on a GPU)."""
        if "unpadded" not in self._cache:
            self._cache["unpadded"] = bool(self.valid.all())
        return self._cache["unpadded"]

    def mask_mod(self):
        """``mask_mod(b, h, q, k) -> bool``: the dense mask's entry (FlexAttention's signature)."""
        valid, n = self.valid, self.valid.shape[-1]
        if self.kind == "causal":
            return lambda b, h, q, k: (k <= q) & valid[b, q] & valid[b, k]
        if self.kind == "full":
            return lambda b, h, q, k: valid[b, q] & valid[b, k]
        sets = self.set_ids

        def two_stream(b, h, q, k):  # slots [x0 (n) | xt (n)]: the table of setdlm.masks
            q_noisy, k_noisy = q >= n, k >= n
            rq, rk = q - n * q_noisy, k - n * k_noisy  # rank within the stream
            sq, sk = sets[b, rq], sets[b, rk]
            clean_q = ~q_noisy & ~k_noisy & (sk <= sq)
            noisy_q = q_noisy & ((~k_noisy & (sk < sq)) | (k_noisy & (sk == sq)))
            return (clean_q | noisy_q) & valid[b, rq] & valid[b, rk]

        return two_stream

    def block_mask(self):
        """The FlexAttention ``BlockMask`` of :meth:`mask_mod` (built once per forward, shared by the layers)."""
        if "block" not in self._cache:
            from torch.nn.attention.flex_attention import create_block_mask

            dev = self.valid.device
            self._cache["block"] = create_block_mask(self.mask_mod(), self.valid.shape[0], None, self.size,
                                                     self.size, device=dev, _compile=dev.type == "cuda")
        return self._cache["block"]


def training_mask(model, rule: MaskRule) -> MaskRule | Tensor:
    """What the objectives pass to ``model``: the rule where the backbone accepts one and the policy uses
    rules on the rule's device, else the dense mask."""
    core = getattr(model, "module", model)  # DDP
    core = getattr(core, "_orig_mod", core)  # torch.compile
    if not (getattr(core, "accepts_mask_rules", False) and uses_rules(rule.valid.device)):
        return rule.dense()
    if rule.kind == "sets" or not rule.unpadded():  # built here, outside the forward (which may be compiled)
        rule.block_mask()
    return rule


@functools.cache
def _compiled_flex():
    """flex_attention compiled once a process (CUDA)."""
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, dynamic=False)


def _flex(q: Tensor, k: Tensor, v: Tensor, block_mask, scale: float | None, gqa: bool) -> Tensor:
    """flex_attention, compiled on CUDA (its eager form materialises the scores), eager elsewhere."""
    from torch.nn.attention.flex_attention import flex_attention

    if q.device.type == "cuda":
        return _compiled_flex()(q, k, v, block_mask=block_mask, scale=scale, enable_gqa=gqa)
    with warnings.catch_warnings():  # eager is what the CPU has (policy "flex" only: tests, comparisons)
        warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")
        return flex_attention(q, k, v, block_mask=block_mask, scale=scale, enable_gqa=gqa)


def attend(q: Tensor, k: Tensor, v: Tensor, rule: MaskRule, *, scale: float | None, dropout_p: float,
           sdpa) -> Tensor:
    """Attention under a rule (see the module's table). q: (B, H, T, hd); k, v: (B, Hkv, T, hd); ``sdpa``:
    the dense path, ``sdpa(q, k, v, mask, is_causal)`` (:func:`setdlm.model.attention`'s)."""
    if rule.kind != "sets" and rule.unpadded():
        return sdpa(q, k, v, None, rule.kind == "causal")
    hd = q.shape[-1]
    if dropout_p > 0 or not flex_available() or (q.is_cuda and (hd < 16 or hd & (hd - 1))):
        # flex_attention has no attention dropout; its CUDA kernels want a power-of-two head size >= 16
        return sdpa(q, k, v, rule.fixed(), False)
    dev = q.device.type  # flex wants one dtype; under autocast q, k can be float32 after RoPE, v bf16
    dt = torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else q.dtype
    return _flex(q.to(dt), k.to(dt), v.to(dt), rule.block_mask(), scale, q.shape[1] != k.shape[1])
