"""Which member of the family a model is, and its ordering policy (docs/method.md §9.1).

=========  =====================================  ==========================================
family     fields used                            schedule
=========  =====================================  ==========================================
``ar``     —                                      identity order
``mdlm``   ``block_size`` (decode sub-block)      ``LinearSchedule(L, L)``
``bd3lm``  ``block_size`` = S                     ``LinearSchedule(L, S)``
``setdlm`` ``D``, ``M`` (default 2D), ``k``, ``b``  ``StaggeredSchedule.from_dm(L, D, M)``
=========  =====================================  ==========================================

``keep_clean_bos`` (SetDLM only, default off): train the way the paper's LM1B/OWT models were trained,
with the row's BOS first in the reveal order, a MASK query scored by the loss, and left out of the
likelihood bound (docs/concepts.md, "Conventions").
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields

from .schedules import LinearSchedule, StaggeredSchedule

FAMILIES = ("ar", "mdlm", "bd3lm", "setdlm")


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

    def __post_init__(self):
        if self.family not in FAMILIES:
            raise ValueError(f"unknown family {self.family!r}; choose one of {', '.join(FAMILIES)}")
        if not isinstance(self.length, int) or self.length < 1:
            raise ValueError(f"length (context L) must be a positive integer, got {self.length!r}")
        if self.mask_token_id is None or self.mask_token_id < 0:
            raise ValueError(f"mask_token_id must be a non-negative token id, got {self.mask_token_id!r}")
        for name in ("k", "b"):  # explicit schedule shape / width: positive and finite (docs/concepts.md)
            v = getattr(self, name)
            if v is not None and not (isinstance(v, (int, float)) and 0 < v < float("inf")):
                raise ValueError(f"{name} must be a positive number, got {v!r}")
        if self.family == "setdlm":
            if self.D is None:
                raise ValueError("family 'setdlm' needs D (target parallelism)")
            if isinstance(self.D, int) and self.D > self.length:
                raise ValueError(f"D (target parallelism) must be <= the context length L, got D={self.D}, "
                                 f"L={self.length}")
            if self.M is None:
                self.M = min(2 * self.D, self.length)
        if self.family == "bd3lm" and self.block_size is None:
            raise ValueError("family 'bd3lm' needs block_size (S)")
        if self.family == "mdlm" and self.block_size is None:
            self.block_size = min(32, self.length)
        if self.block_size is not None and not (1 <= self.block_size <= self.length):
            raise ValueError(f"block_size must lie in [1, L={self.length}], got {self.block_size}")
        if not isinstance(self.keep_clean_bos, bool):
            raise ValueError(f"keep_clean_bos must be true or false, got {self.keep_clean_bos!r}")
        if self.keep_clean_bos and self.family != "setdlm":
            raise ValueError(f"keep_clean_bos applies to family 'setdlm' only, not to {self.family!r}")
        self.schedule()  # validates D, M, k, b and divisibility

    def schedule(self):
        if self.family == "setdlm":
            return StaggeredSchedule.from_dm(self.length, self.D, self.M, k=self.k, b=self.b)
        if self.family == "bd3lm":
            return LinearSchedule(self.length, self.block_size)
        if self.family == "mdlm":
            return LinearSchedule(self.length, self.length)
        return None

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "FamilyConfig":
        known = {f.name for f in fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise ValueError(f"unknown FamilyConfig fields: {sorted(unknown)}")
        return cls(**d)
