"""Which member of the family a model is: the family registry and a model's family configuration
(docs/method.md §9.1).

Every rule that depends on the family lives here, in one :class:`Family` per member, registered by name
(:data:`REGISTRY`, the attention-registry pattern of ``transformers`` applied to families). Training,
decoding, the memory check, the evaluators, the lm-eval adapter and the model card read the family's
entry (``FamilyConfig.spec``) instead of comparing its name:

=========  =====================================  ==========================================  =======
family     fields used                            schedule                                    streams
=========  =====================================  ==========================================  =======
``ar``     —                                      identity order                              1
``mdlm``   ``block_size`` (decode sub-block)      ``LinearSchedule(L, L)``                    1
``bd3lm``  ``block_size`` = S                     ``LinearSchedule(L, S)``                    2
``setdlm`` ``D``, ``M`` (default 2D), ``k``, ``b``  ``StaggeredSchedule.from_dm(L, D, M)``      2
=========  =====================================  ==========================================  =======

*streams*: the sequences of length L a training row feeds the backbone (BD3LM and SetDLM see the clean
sequence and the noisy one, docs/method.md §2.3, §2.8). The decode settings each family takes are the table in
:mod:`setdlm.decoding.settings`.

``keep_clean_bos`` (SetDLM only, default off): train the way the paper's LM1B/OWT models were trained,
with the row's BOS first in the reveal order, a MASK query scored by the loss, and left out of the
likelihood bound (docs/concepts.md, "Conventions").

``ar_weight`` (SetDLM only, default 0: the paper's objective): the weight of a next-token loss on the clean
stream read in position order, which makes the network an AR model too (docs/method.md §2.10); the
``speculate="next_token"`` decode verifies with that head (docs/decoding.md). It changes training only, not the bound.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, fields

from .errors import UserError
from .schedules import LinearSchedule, StaggeredSchedule


@dataclass(frozen=True)
class Family:
    """Everything that differs between the members of the family (docs/method.md §9.1)."""

    name: str  # "ar", "mdlm", "bd3lm", "setdlm": FamilyConfig.family, the CLI's --family
    title: str  # "set diffusion (SetDLM)": the model card's words
    config_fields: tuple[str, ...]  # the FamilyConfig fields the family uses (the others stay None / False)
    train_flags: tuple[str, ...]  # the training options (TrainConfig fields) that apply to it
    decode_settings: tuple[str, ...]  # the family-specific DecodeSettings fields that apply to it
    streams: int  # sequences of length L per training row: 1, or 2 (clean + noisy, docs/method.md §2.3, §2.8)
    objective: str  # the training loss: a key of setdlm.objectives.OBJECTIVES
    decoder: str  # the decoder: a key of setdlm.decoding.api.DECODERS
    cache_holds: str | None  # the decode size its KV cache holds twice beyond L ("window", "block_size"), or None
    reveal_cache_order: bool  # cache_order="reveal" applies (docs/method.md §4.5); the others ignore it
    left_to_right: bool  # AR: one order, so the likelihood is exact; infilling sees the prefix only (§4.6)
    ordered: bool  # every target is predicted in one order (AR: left to right, SetDLM: the sampled order)
    complete: Callable[[FamilyConfig], None]  # fills the family's defaults in, checks what it needs
    schedule: Callable[[FamilyConfig], object]  # its ordering policy (None: the identity order)
    describe: Callable[[FamilyConfig], str]  # its schedule in words (the model card)
    config_from_flags: Callable[[Mapping], dict]  # FamilyConfig fields from training option values

    def decode_sizes(self, cfg: FamilyConfig, window: int | None, block_size: int | None) -> tuple[int, int]:
        """``(window, block_size)`` a decode runs with: the setting given, else the family's own (``w = D``,
        ``block_size`` = the model's), 1 where the family does not use it (docs/method.md §4.2)."""
        w = (window or cfg.D) if "window" in self.decode_settings else 1
        s = (block_size or cfg.block_size) if "block_size" in self.decode_settings else 1
        return _filled(w), _filled(s)


REGISTRY: dict[str, Family] = {}


def register(family: Family) -> Family:
    """Add ``family`` to :data:`REGISTRY` under its name (a name registered twice is a ``ValueError``)."""
    if family.name in REGISTRY:
        raise UserError(f"family {family.name!r} is registered already")
    if family.streams not in (1, 2):
        raise UserError(f"family {family.name!r}: streams must be 1 or 2, got {family.streams!r}")
    REGISTRY[family.name] = family
    return family


def get_family(name: str) -> Family:
    """The registered family called ``name``; an unknown name is a ``ValueError`` listing the known ones."""
    try:
        return REGISTRY[name]
    except (KeyError, TypeError):
        raise UserError(f"unknown family {name!r}; choose one of {', '.join(REGISTRY)}") from None


def using(kind: str, name: str) -> tuple[str, ...]:
    """The families whose ``kind`` (``"decode_settings"``, ``"train_flags"`` or ``"config_fields"``) include ``name``,
    most general first (SetDLM, BD3LM, MDLM), the order error messages list them in."""
    return tuple(f.name for f in reversed(REGISTRY.values()) if name in getattr(f, kind))


# ---------------------------------------------------------------------------------------------------------
# the four members
# ---------------------------------------------------------------------------------------------------------

def _nothing(cfg: FamilyConfig) -> None:
    return None


def _complete_setdlm(c: FamilyConfig) -> None:
    if c.D is None:
        raise UserError("family 'setdlm' needs D (target parallelism)")
    if isinstance(c.D, int) and c.D > c.length:
        raise UserError(f"D (target parallelism) must be <= the context length L, got D={c.D}, L={c.length}")
    if c.M is None:
        c.M = min(2 * c.D, c.length)


def _complete_bd3lm(c: FamilyConfig) -> None:
    if c.block_size is None:
        raise UserError("family 'bd3lm' needs block_size (S)")


def _complete_mdlm(c: FamilyConfig) -> None:
    if c.block_size is None:
        c.block_size = min(32, c.length)


def _describe_setdlm(f: FamilyConfig) -> str:
    s = f.schedule()
    return (f"position-offset schedule, L = {f.length}, D = {f.D} (target parallelism), M = {f.M} (sets of at most "
            f"{f.M} tokens: \"S ≤ {f.M}\"), k = {s.k:.4g}, b = {s.b:.4g}; decode with window w = D = {f.D}"
            + (f"; a next-token head on the clean stream (ar_weight = {f.ar_weight:g}): speculate='next_token'"
               if f.ar_weight else ""))


def _filled(size: int | None) -> int:
    """A size that the family's ``complete`` fills in or requires (FamilyConfig.__post_init__ runs it)."""
    assert size is not None, "FamilyConfig.__post_init__ completes the family's sizes"
    return size


def _pick(*names: str) -> Callable[[Mapping], dict]:
    """Training option values -> the FamilyConfig fields ``names`` (taken as they are)."""
    return lambda flags: {n: flags.get(n) for n in names}


AR = register(Family(
    "ar", "autoregressive (AR)", config_fields=(), train_flags=(), decode_settings=(), streams=1, objective="ar",
    decoder="ar", cache_holds=None, reveal_cache_order=False, left_to_right=True, ordered=True, complete=_nothing,
    schedule=_nothing, describe=lambda f: f"left to right, L = {f.length}", config_from_flags=_pick()))
MDLM = register(Family(
    "mdlm", "masked diffusion (MDLM)", config_fields=("block_size",), train_flags=("block_size",),
    decode_settings=("block_size", "threshold"), streams=1, objective="mdlm", decoder="mdlm", cache_holds=None,
    reveal_cache_order=False, left_to_right=False, ordered=False, complete=_complete_mdlm,
    schedule=lambda f: LinearSchedule(f.length, f.length),
    describe=lambda f: f"L = {f.length}, semi-autoregressive decoding sub-block {f.block_size}",
    config_from_flags=_pick("block_size")))
BD3LM = register(Family(
    "bd3lm", "block diffusion (BD3LM)", config_fields=("block_size",), train_flags=("block_size",),
    decode_settings=("block_size", "threshold"), streams=2, objective="bd3lm", decoder="bd3lm",
    cache_holds="block_size", reveal_cache_order=False, left_to_right=False, ordered=False, complete=_complete_bd3lm,
    schedule=lambda f: LinearSchedule(f.length, _filled(f.block_size)),
    describe=lambda f: f"blocks of S = {f.block_size}, L = {f.length}",
    config_from_flags=lambda flags: {"block_size": flags.get("block_size") or flags.get("D")}))  # S defaults to D
SETDLM = register(Family(
    "setdlm", "set diffusion (SetDLM)", config_fields=("D", "M", "k", "b", "keep_clean_bos", "ar_weight"),
    train_flags=("D", "M", "k", "keep_clean_bos", "ar_weight"), decode_settings=("window", "threshold", "speculate"),
    streams=2,
    objective="setdlm", decoder="setdlm", cache_holds="window", reveal_cache_order=True, left_to_right=False,
    ordered=True, complete=_complete_setdlm,
    schedule=lambda f: StaggeredSchedule.from_dm(f.length, _filled(f.D), f.M, k=f.k, b=f.b), describe=_describe_setdlm,
    config_from_flags=lambda flags: {**_pick("D", "M", "k")(flags),
                                     "keep_clean_bos": bool(flags.get("keep_clean_bos")),
                                     "ar_weight": float(flags.get("ar_weight") or 0.0)}))

FAMILIES = tuple(REGISTRY)  # ("ar", "mdlm", "bd3lm", "setdlm")


# ---------------------------------------------------------------------------------------------------------
# a model's family configuration (config.json's "family")
# ---------------------------------------------------------------------------------------------------------

@dataclass
class FamilyConfig:
    family: str
    length: int  # L: training context length
    mask_token_id: int
    block_size: int | None = None  # BD3LM S; MDLM semi-AR decoding sub-block
    D: int | None = None  # SetDLM target parallelism
    M: int | None = None  # SetDLM max set size (default 2D, capped at L)
    k: float | None = None  # optional explicit schedule shape
    b: float | None = None  # optional explicit schedule width (a float in (0, 1], not the decoding window)
    keep_clean_bos: bool = False  # SetDLM: BOS first in the order, scored in training, not in the bound
    ar_weight: float = 0.0  # SetDLM: weight of the clean stream's next-token loss in training (0: none)

    def __post_init__(self):
        spec = get_family(self.family)
        if not isinstance(self.length, int) or self.length < 1:
            raise UserError(f"length (context L) must be a positive integer, got {self.length!r}")
        if self.mask_token_id is None or self.mask_token_id < 0:
            raise UserError(f"mask_token_id must be a non-negative token id, got {self.mask_token_id!r}")
        for name in ("k", "b"):  # explicit schedule shape / width: positive and finite (docs/concepts.md)
            v = getattr(self, name)
            if v is not None and not (isinstance(v, (int, float)) and 0 < v < float("inf")):
                raise UserError(f"{name} must be a positive number, got {v!r}")
        spec.complete(self)
        if self.block_size is not None and not (1 <= self.block_size <= self.length):
            raise UserError(f"block_size must lie in [1, L={self.length}], got {self.block_size}")
        if not isinstance(self.keep_clean_bos, bool):
            raise UserError(f"keep_clean_bos must be true or false, got {self.keep_clean_bos!r}")
        if self.keep_clean_bos and "keep_clean_bos" not in spec.config_fields:
            raise UserError(f"keep_clean_bos applies to family {'/'.join(using('config_fields', 'keep_clean_bos'))!r} "
                             f"only, not to {self.family!r}")
        w = self.ar_weight
        if isinstance(w, bool) or not (isinstance(w, (int, float)) and 0 <= w < float("inf")):
            raise UserError(f"ar_weight must be a finite number >= 0, got {w!r}", fields=("ar_weight",))
        self.ar_weight = float(w)
        if self.ar_weight and "ar_weight" not in spec.config_fields:
            raise UserError(f"ar_weight applies to family {'/'.join(using('config_fields', 'ar_weight'))!r} only, "
                            f"not to {self.family!r}", fields=("ar_weight",))
        self.schedule()  # validates D, M, k, b and divisibility

    @property
    def spec(self) -> Family:
        """The registered :class:`Family` of this configuration."""
        return get_family(self.family)

    def schedule(self):
        """The family's ordering policy over L positions (None for AR: the identity order)."""
        return self.spec.schedule(self)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> FamilyConfig:
        known = {f.name for f in fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise UserError(f"unknown FamilyConfig fields: {sorted(unknown)}")
        return cls(**d)


def family_from_flags(family: str, length: int, mask_token_id: int, flags: Mapping) -> FamilyConfig:
    """The :class:`FamilyConfig` that training options ``flags`` (TrainConfig field values: ``D``, ``M``, ``k``,
    ``block_size``, ``keep_clean_bos``) describe for ``family``: the options of other families are dropped
    (BD3LM's S defaults to ``D``)."""
    return FamilyConfig(family, length=length, mask_token_id=mask_token_id,
                        **get_family(family).config_from_flags(flags))

