"""A corpus: documents for language modelling, or prompt/completion pairs (docs/method.md §2.1, §9.5).

Every text source (:mod:`setdlm.data.sources`, the built-in corpora of :mod:`setdlm.data.builtin`) yields a
:class:`Corpus`; :func:`setdlm.data.dataset.build_dataset` turns one into token rows: documents are packed,
pairs become ``[BOS] prompt completion [EOS]`` with the prompt as context.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import UserError


@dataclass
class Corpus:
    """Documents for language modelling, or prompt/completion pairs; never both."""

    texts: list[str] = field(default_factory=list)
    pairs: list[tuple[str, str]] = field(default_factory=list)
    name: str = ""

    def __post_init__(self):
        if self.texts and self.pairs:
            raise UserError(f"{self.name}: mixes 'text' records with 'prompt'/'completion' records")

    @property
    def is_pairs(self) -> bool:
        return bool(self.pairs)

    def __len__(self) -> int:
        return len(self.pairs) if self.pairs else len(self.texts)

    def extend(self, other: Corpus) -> None:
        self.texts += other.texts
        self.pairs += other.pairs
        self.__post_init__()
