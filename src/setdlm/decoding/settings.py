"""The decoding settings, named and checked once (docs/decoding.md, docs/method.md §4).

:class:`DecodeSettings` holds every setting of a decode that is not per-call data (prompts, seeds, reveal
times, batch size, progress and trace stay arguments of the call). Its ``__post_init__`` checks each value
on its own; :meth:`DecodeSettings.check_for` checks which settings apply to a family. Which family uses
which setting (:data:`SETTING_FAMILIES`; "all" = AR, MDLM, BD3LM and SetDLM):

=====================  ==================  ====================================================================
setting                families            meaning
=====================  ==================  ====================================================================
``window``             SetDLM              positional window ``w`` (default ``D``; docs/method.md §4.2)
``threshold``          SetDLM BD3LM MDLM   τ in (0, 1]: also commit every mask this confident (None = off)
``block_size``         BD3LM MDLM          block / semi-AR sub-block (default ``family.block_size``)
``cache_order``        SetDLM              ``"position"`` (default) or ``"reveal"`` (docs/method.md §4.5);
                                           ignored by the other families
``speculate``          SetDLM              lossless self-speculative decoding: the window drafts, the
                                           left-to-right (w = 1) conditional verifies; the output is that
                                           of ``window=1`` (docs/decoding.md, "Self-speculative decoding");
                                           ``"next_token"``: the clean stream's next-token head verifies (a model
                                           trained with ``ar_weight > 0``); the output is that AR decode's
``verify_layout``      SetDLM              ``speculate=True``: which horizons of a step carry a window of masks,
                                           ``"auto"`` (by batch size), ``"all"`` or ``"last"`` (docs/decoding.md,
                                           "Self-speculative decoding"); the output is the same either way
``temperature``        all                 0 = greedy
``top_p``, ``top_k``   all                 nucleus (1.0 = off), top-k (0 = off)
``repetition_penalty`` all                 HF's multiplicative rule (1.0 = off)
``length_penalty``     all                 ``(start, factor)``: EOS boost (docs/method.md §5.3)
``max_new_tokens``     all (generate)      new tokens per row (None: :func:`default_max_new_tokens`,
                                           min(256, what the prompt leaves of the context));
                                           ``fill``/``infill`` decode the gaps they are given instead
``eos_token_id``       all                 default the tokenizer's; generate stops at it, fill uses it only
                                           for the length penalty
``ignore_eos``         all (generate)      do not stop at EOS
``stop``               all (generate)      stop strings (needs a tokenizer)
``constraint``         all                 the output must match it (needs a tokenizer; one for every row or
                                           one per row, None = free): docs/decoding.md "Constrained decoding"
=====================  ==================  ====================================================================

Setting ``window``, ``threshold`` or ``block_size`` for a family it does not apply to, or a generate-only
setting for ``fill``/``infill``, is a ``ValueError`` (:meth:`~DecodeSettings.check_for`); :func:`applicable`
keeps those that apply, to sweep one setting over every family. The fields whose metadata holds a
:class:`RequestField` are those a request sets by name (the server's body, the lm-eval adapter's model_args:
:mod:`setdlm.decoding.request`).
"""

from __future__ import annotations

import difflib
import math
import typing
import warnings
from dataclasses import dataclass, field, fields
from typing import Literal

from ..family import using
from ..errors import InputWarning, UserError
from .sampling import Sampling
from .structured.constraint import Constraint, as_constraint

# speculate=True's verification layouts (setdlm.decoding.speculative.windowed_horizons)
VerifyLayout = Literal["auto", "all", "last"]
VERIFY_LAYOUTS: tuple[VerifyLayout, ...] = typing.get_args(VerifyLayout)
CacheOrder = Literal["position", "reveal"]  # SetDLM: the order of newly cached tokens (docs/method.md §4.5)
# setting -> the families it applies to (the others are a ValueError when set): the family registry's
# decode_settings (setdlm.family), read per setting
SETTING_FAMILIES = {name: using("decode_settings", name) for name in ("window", "block_size", "threshold", "speculate")}
# fill and infill decode the gaps they are given: no budget, EOS stop or cache order
GENERATE_ONLY = ("max_new_tokens", "ignore_eos", "stop", "cache_order")

# The one rule for max_new_tokens when none is given (docs/decoding.md, "Prompt length and max_new_tokens"):
# at most MAX_NEW_TOKENS new tokens, and never more than the room the prompt leaves of the context (L - prompt
# tokens), so a default decode never slides past the context and a model with a long context (SmolLM2: 8,192)
# is not asked for thousands of tokens. 256 is lm-evaluation-harness's default budget; vLLM's server caps at
# the room likewise. Entry point -> where it applies, in words (docs/decoding.md's table is this; a test checks it).
MAX_NEW_TOKENS = 256
MAX_NEW_TOKENS_DEFAULTS = {
    "generate": "`generate`, `Model.generate` (per row: each row's own room), `Session.add` / `prepare`",
    "cli": "`setdlm generate`, `setdlm run`, `setdlm chat` (`--max-new-tokens`; per prompt)",
    "server": "the server (`max_tokens`; the room: what prompt and suffix leave)",
    "evaluate": "`evaluation.reasoning` / `parallel`, `setdlm eval` (the room: what the longest prompt leaves)",
    "harness": "the lm-eval adapter (`setdlm.evaluation.harness`), when a task sets no `max_gen_toks`",
    "demo": "`setdlm demo` (`--max-new-tokens`: the Shakespeare continuation)",
}


def default_max_new_tokens(entry_point: str, room: int) -> int:
    """``max_new_tokens`` of ``entry_point`` (a key of :data:`MAX_NEW_TOKENS_DEFAULTS`) when the caller gives
    none: ``min(MAX_NEW_TOKENS, room)``, ``room`` being what the prompt leaves of the context (at least 1)."""
    if entry_point not in MAX_NEW_TOKENS_DEFAULTS:
        raise KeyError(f"unknown entry point {entry_point!r}; choose one of {', '.join(MAX_NEW_TOKENS_DEFAULTS)}")
    if isinstance(room, bool) or not isinstance(room, int):
        raise TypeError(f"room must be an int (what the prompt leaves of the context), got {room!r}")
    return max(1, min(MAX_NEW_TOKENS, room))


def max_new_tokens_table() -> str:
    """The Markdown table of :data:`MAX_NEW_TOKENS_DEFAULTS` (docs/decoding.md)."""
    rows = ["| entry point | default `max_new_tokens` |", "|---|---|"]
    rows += [f"| {where} | min({MAX_NEW_TOKENS}, the room) |" for where in MAX_NEW_TOKENS_DEFAULTS.values()]
    return "\n".join(rows)


DRAFTER_SETTINGS = ("window", "speculate")  # what a model with a set drafter takes (docs/drafter.md)


def drafts(model) -> bool:
    """Whether ``model``'s backbone has a set drafter beside it (:mod:`setdlm.formats.drafted`): it then decodes
    with drafts under ``speculate="next_token"`` (docs/drafter.md)."""
    return callable(getattr(model.backbone, "draft", None))


def warn_wide_window(settings: DecodeSettings, fam) -> None:
    """An :class:`~setdlm.errors.InputWarning` when ``settings.window`` is wider than the ``M`` positions the
    SetDLM ``fam`` was trained to predict at once (its largest set; docs/method.md §7.9): past them its
    predictions are untrained. Lossless speculation only drafts with the window, so it is left alone."""
    w, M = settings.window, getattr(fam, "M", None)
    if w is not None and M is not None and w > M and not settings.speculate:
        warnings.warn(InputWarning(f"window={w} is wider than the {M} positions this model was trained to predict "
                                   f"at once (D={fam.D}, M={M}): past M its predictions are untrained and the text "
                                   f"degrades; use window <= {M} (default D={fam.D})", fields=("window",)),
                      stacklevel=3)


def warn_unused_layout(settings: DecodeSettings) -> None:
    """An :class:`~setdlm.errors.InputWarning` when ``verify_layout`` is set but nothing speculates (a sweep's
    fixed settings may carry it for its speculative points; anywhere else it would be ignored without a word)."""
    if settings.verify_layout != "auto" and settings.speculate is not True:
        warnings.warn(InputWarning(f"verify_layout={settings.verify_layout!r} applies with speculate=True only; "
                                   "this decode does not speculate, so it is ignored",
                                   fields=("verify_layout", "speculate")), stacklevel=3)


def family_settings(fam) -> list[str]:
    """The family-specific settings that ``fam`` (a :class:`~setdlm.family.FamilyConfig`) takes: those of
    :data:`SETTING_FAMILIES` listing its family, ``cache_order`` where it caches in reveal order and
    ``verify_layout`` where it speculates (SetDLM)."""
    names = [name for name, fams in SETTING_FAMILIES.items() if fam.family in fams]
    return names + (["cache_order"] if fam.spec.reveal_cache_order else []) + \
        (["verify_layout"] if "speculate" in names else [])


MAX_STOP = 16  # stop strings a request gives (lm-eval's until lists plus EOS reach 5)


@dataclass(frozen=True)
class RequestField:
    """How a request gives a :class:`DecodeSettings` field, under the field's own name: the ``request``
    metadata of the fields a request may set (the server's JSON body, the lm-eval adapter's model_args), read
    by :func:`setdlm.decoding.request.request_settings` (docs/architecture.md). ``kind``: the JSON value it
    takes (``"switch"``: a boolean, or one of the field's ``values``; ``"choice"``: a string that
    DecodeSettings checks; ``"strings"``: a string or a list of ``low`` to ``high`` of them); ``low``, ``high``
    (``"width"``: the canvas width the caller gives), ``low_open``: the bounds checked there, beyond
    DecodeSettings' own; ``says``: what a value of the wrong type is told it must be, where DecodeSettings
    checks the range itself."""

    kind: Literal["number", "integer", "switch", "choice", "strings"]
    low: float | None = None
    high: float | Literal["width"] | None = None
    low_open: bool = False
    says: str | None = None


def _positive_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 1


@dataclass(frozen=True)
class DecodeSettings:
    """How to decode (see the module table for which family uses which field). Frozen and checked on
    construction: a bad value is a ``ValueError``/``TypeError`` naming the field."""

    window: int | None = field(default=None, metadata={"help": "setdlm: sliding window w (default D)",
                                                       "request": RequestField("integer", 1, "width")})
    threshold: float | None = field(default=None, metadata={
        "help": "setdlm/bd3lm/mdlm: also commit every mask with probability >= tau (default off)",
        "request": RequestField("number", says="a number in (0, 1]")})
    block_size: int | None = field(default=None, metadata={"help": "bd3lm/mdlm: block size (default the model's)",
                                                           "request": RequestField("integer", 1, "width")})
    cache_order: CacheOrder | None = field(default=None, metadata={
        "help": "setdlm: order of newly cached tokens, position (default) or reveal",
        "choices": ("position", "reveal"), "request": RequestField("choice")})
    speculate: bool | Literal["next_token"] | None = field(default=None, metadata={
        "help": "setdlm: lossless self-speculative decoding, the window w drafts and the left-to-right decode "
                "verifies (the output of --window 1, in fewer forwards); a switch: to verify with the model's "
                "next-token head instead, give --speculate-next-token (not both)",
        "values": {"next_token": "setdlm: speculate='next_token': the window drafts, the model's next-token head "
                                 "verifies (a model "
                         "trained with --ar-weight > 0); the output is that AR decode's, in about 2w positions a "
                         "forward"},
        "request": RequestField("switch")})
    verify_layout: VerifyLayout = field(default="auto", metadata={
        "help": "setdlm --speculate: which horizons of a step carry a window of masks: auto (by batch size, "
                "default), all (the next draft ready wherever the step ends) or last (the whole draft's only; "
                "fewer positions a forward); the output is the same",
        "choices": VERIFY_LAYOUTS, "request": RequestField("choice")})
    temperature: float = field(default=0.0, metadata={"help": "0 = greedy (default)",
                                                      "request": RequestField("number", 0, 2)})
    top_p: float = field(default=1.0, metadata={"help": "nucleus sampling (1 = off)",
                                                "request": RequestField("number", 0, 1, low_open=True)})
    top_k: int = field(default=0, metadata={"help": "top-k sampling (0 = off)",
                                            "request": RequestField("integer", 0, 2**63 - 1)})
    repetition_penalty: float = field(default=1.0, metadata={"help": "> 1 discourages repeats (the paper's "
                                                                      "infilling: 1.2)",
                                                             "request": RequestField("number", says="a number > 0")})
    length_penalty: tuple[int, float] | None = field(default=None, metadata={
        "help": "START FACTOR: boost EOS after START generated tokens", "nargs": 2})
    max_new_tokens: int | None = field(default=None, metadata={"help": "tokens to generate per prompt"})
    eos_token_id: int | tuple[int, ...] | None = field(default=None, metadata={
        "help": "EOS token id (repeatable; default the tokenizer's)"})
    ignore_eos: bool = field(default=False, metadata={"help": "do not stop at EOS: always max-new-tokens",
                                                      "request": RequestField("switch")})
    stop: tuple[str, ...] = field(default=(), metadata={"help": "stop string (repeatable)",
                                                         "request": RequestField("strings", 1, MAX_STOP)})
    constraint: Constraint | tuple[Constraint | None, ...] | None = field(default=None, metadata={
        "help": "regex(), json_schema() or choice(), a JSON Schema dict, a Pydantic model class or a list of choices: "
                "every row's output matches it (or one per row)"})

    def __post_init__(self):
        for name in ("window", "block_size"):
            v = getattr(self, name)
            if v is not None and not _positive_int(v):
                raise UserError(f"{name} must be a positive integer, got {v!r}")
        if self.threshold is not None and not (_number(self.threshold) and 0.0 < self.threshold <= 1.0):
            raise UserError(f"threshold must lie in (0, 1] or be None (off), got {self.threshold!r}",
                            fields=("threshold",))
        if self.speculate is not None and not isinstance(self.speculate, bool) and self.speculate != "next_token":
            raise UserError(f"speculate must be True, False, None or 'next_token', got {self.speculate!r}",
                            fields=("speculate",))
        if self.speculate and self.threshold is not None:
            raise UserError("speculate verifies every token against the left-to-right decode, which commits one "
                            "token per step; threshold does not apply (leave it None)",
                            fields=("speculate", "threshold"))
        if self.speculate and self.cache_order == "reveal":
            raise UserError("speculate caches tokens in position order, as the left-to-right decode it reproduces; "
                            "cache_order='reveal' does not apply", fields=("speculate", "cache_order"))
        if self.verify_layout not in VERIFY_LAYOUTS:
            raise UserError(f"verify_layout must be one of {', '.join(VERIFY_LAYOUTS)}, got {self.verify_layout!r}",
                            fields=("verify_layout",))
        if self.verify_layout != "auto" and self.speculate is not None and self.speculate is not True:
            raise UserError(f"verify_layout={self.verify_layout!r} lays out the self-speculative decode's "
                            "verification; it applies with speculate=True only", fields=("verify_layout", "speculate"))
        if self.cache_order is not None and self.cache_order not in ("position", "reveal"):
            raise UserError(f"cache_order must be 'position' or 'reveal', got {self.cache_order!r}")
        if not (_number(self.temperature) and math.isfinite(self.temperature) and self.temperature >= 0):
            raise UserError(f"temperature must be a finite number >= 0, got {self.temperature!r}")
        if not (_number(self.top_p) and 0.0 < self.top_p <= 1.0):
            raise UserError(f"top_p must lie in (0, 1], got {self.top_p!r}")
        if not (isinstance(self.top_k, int) and not isinstance(self.top_k, bool) and self.top_k >= 0):
            raise UserError(f"top_k must be an integer >= 0 (0 = off), got {self.top_k!r}")
        if not (_number(self.repetition_penalty) and self.repetition_penalty > 0):
            raise UserError(f"repetition_penalty must be > 0, got {self.repetition_penalty!r}")
        lp = self.length_penalty
        if lp is not None:
            if not isinstance(lp, (tuple, list)) or len(lp) != 2:
                raise TypeError(f"length_penalty must be a pair (start, factor), got {lp!r}")
            if not (isinstance(lp[0], int) and lp[0] >= 0 and _number(lp[1]) and lp[1] >= 1.0):
                raise UserError(f"length_penalty must be (start >= 0, factor >= 1), got {lp!r}")
            object.__setattr__(self, "length_penalty", tuple(lp))
        if isinstance(self.max_new_tokens, bool):
            raise TypeError("max_new_tokens must be an int, got bool")
        if self.max_new_tokens is not None and not _positive_int(self.max_new_tokens):
            raise UserError(f"max_new_tokens must be a positive integer, got {self.max_new_tokens!r}")
        e = self.eos_token_id
        if e is not None and not isinstance(e, (int, list, tuple)):
            raise TypeError(f"eos_token_id must be a token id or a list of them, got {type(e).__name__}")
        if isinstance(e, list):
            object.__setattr__(self, "eos_token_id", tuple(e))
        if not isinstance(self.ignore_eos, bool):
            raise TypeError(f"ignore_eos must be True or False, got {self.ignore_eos!r}")
        stop = self.stop if self.stop is not None else ()
        if not isinstance(stop, (str, list, tuple)):
            raise TypeError(f"stop must be a string or a list of strings, got {type(stop).__name__}")
        stops = (stop,) if isinstance(stop, str) else tuple(stop)
        if not all(isinstance(s, str) and s for s in stops):
            raise UserError(f"stop must be a non-empty string or a list of them, got {stop!r}")
        object.__setattr__(self, "stop", stops)
        c = self.constraint  # a list of strings is one list of choices; any other list, one constraint per row
        if isinstance(c, (list, tuple)) and not (c and all(isinstance(x, str) for x in c)):
            c = tuple(as_constraint(x) for x in c)
        else:
            c = as_constraint(c)
        object.__setattr__(self, "constraint", c)
        if c is not None and stops:
            raise UserError("stop strings would cut a constrained output short of its match; give constraint or stop")

    def constraints(self, rows: int) -> list[Constraint | None] | None:
        """The constraint of each of ``rows`` rows (None: no row has one); a per-row tuple must have one
        entry per row."""
        c = self.constraint
        if c is None:
            return None
        if isinstance(c, Constraint):
            return [c] * rows
        if len(c) != rows:
            raise UserError(f"constraint has {len(c)} entries, one per row, but {rows} rows are decoded")
        return list(c)

    def check_for(self, family: str, mode: str = "generate", *, drafts: bool = False) -> None:
        """A ``ValueError`` for a setting that is set but does not apply to ``family`` (see the module
        table), or, for ``mode="fill"`` (fill and infill), a generate-only setting. ``drafts``: the model has a
        set drafter (:func:`drafts`), which takes ``window`` and ``speculate`` whatever its base's family."""
        for name, fams in SETTING_FAMILIES.items():
            v = getattr(self, name)
            if v is not None and v is not False and family not in fams and not (drafts and name in DRAFTER_SETTINGS):
                raise UserError(f"{name} applies to {'/'.join(fams)} models, not to this {family!r} model",
                                fields=(name,))
        if mode == "fill":
            for name in GENERATE_ONLY:
                if getattr(self, name) != _DEFAULTS[name]:
                    raise UserError(f"{name} applies to generate only; fill and infill decode every MASK",
                                    fields=(name,))

    def sampling(self, mask_token_id: int, eos_token_ids: tuple[int, ...]) -> Sampling:
        """The logits processors and commit threshold of these settings (docs/method.md §4.3)."""
        if self.length_penalty is not None and not eos_token_ids:
            raise UserError("length_penalty boosts EOS but no eos_token_id is known; pass eos_token_id")
        return Sampling(mask_token_id, temperature=self.temperature, top_p=self.top_p, top_k=self.top_k,
                        repetition_penalty=self.repetition_penalty, length_penalty=self.length_penalty,
                        threshold=self.threshold, eos_token_ids=tuple(eos_token_ids))

    @classmethod
    def of(cls, settings: DecodeSettings | None, keywords: dict, what: str) -> DecodeSettings:
        """``settings``, or the settings the keyword arguments of ``what`` (e.g. ``generate``) spell out;
        giving both is a ``ValueError``, an unknown keyword a ``TypeError`` naming setdlm's spelling. The common
        spellings of Hugging Face, OpenAI/vLLM and Ollama are taken (:data:`ALIASES`, ``do_sample``)."""
        keywords = hf_keywords(keywords, what)
        unknown = sorted(set(keywords) - set(_DEFAULTS))
        if unknown:
            near = difflib.get_close_matches(unknown[0], list(_DEFAULTS), n=1, cutoff=0.7)
            hint = f"; did you mean {near[0]!r}?" if near else f"; the settings are: {', '.join(_DEFAULTS)}"
            raise TypeError(f"{what}() got an unexpected keyword argument {unknown[0]!r}{hint}")
        if settings is None:
            return cls(**keywords)
        if not isinstance(settings, DecodeSettings):
            raise TypeError(f"settings must be a DecodeSettings, got {type(settings).__name__}")
        if keywords:
            raise UserError(f"give settings= or the keyword settings ({', '.join(sorted(keywords))}), not both")
        return settings


_DEFAULTS = {f.name: f.default for f in fields(DecodeSettings)}
# other libraries' names of a setting -> setdlm's (Hugging Face's stop_strings, OpenAI's and vLLM's max_tokens,
# Ollama's num_predict): taken as they are
ALIASES = {"max_tokens": "max_new_tokens", "max_completion_tokens": "max_new_tokens", "num_predict": "max_new_tokens",
           "stop_strings": "stop", "stop_sequences": "stop"}
# keywords that have no setting here, and what to do instead
NOT_SETTINGS = {"num_return_sequences": "decode the prompt n times with one seed each: generate([p] * n, "
                                        "temperature=..., seed=list(range(n)))",
                "n": "decode the prompt n times with one seed each: generate([p] * n, temperature=..., "
                     "seed=list(range(n)))",
                "max_length": "give max_new_tokens, the tokens after the prompt (HF's max_length counts the prompt)",
                "num_beams": "setdlm decodes greedily or by sampling; there is no beam search"}


def hf_keywords(keywords: dict, what: str) -> dict:
    """``keywords`` with other libraries' spellings as setdlm's: :data:`ALIASES` renamed, ``do_sample``
    (Hugging Face) as ``temperature`` (False: 0, greedy; True: 1.0 unless a temperature is given). A
    keyword of :data:`NOT_SETTINGS` is a ``TypeError`` saying what to do instead; giving a setting under
    two names is one too."""
    out = dict(keywords)
    for name, hint in NOT_SETTINGS.items():
        if name in out:
            raise TypeError(f"{what}() takes no {name}: {hint}")
    for alias, name in ALIASES.items():
        if alias in out:
            if name in out:
                raise TypeError(f"{what}() got both {alias!r} and {name!r}, two names of one setting; give {name}")
            out[name] = out.pop(alias)
    if "do_sample" in out:
        sample = out.pop("do_sample")
        if not isinstance(sample, bool):
            raise TypeError(f"do_sample must be True or False, got {sample!r}")
        if not sample:
            out["temperature"] = 0.0
        else:
            out.setdefault("temperature", 1.0)
            if out["temperature"] == 0:
                raise UserError("do_sample=True with temperature=0 asks for sampling and for greedy decoding; "
                                "give a temperature > 0", fields=("temperature",))
    return out


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def applicable(family: str, **settings) -> dict:
    """The ``settings`` that apply to ``family`` (for sweeping one setting over every family)."""
    return {k: v for k, v in settings.items() if k not in SETTING_FAMILIES or family in SETTING_FAMILIES[k]}

