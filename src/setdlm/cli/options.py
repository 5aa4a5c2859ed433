"""The typed options of the decoding commands, built and checked before any model loads
(``setdlm generate`` / ``setdlm infill``; ``eval`` and ``bench`` take a
:class:`~setdlm.evaluation.TaskSpec` and a :class:`~setdlm.decoding.settings.DecodeSettings`).

A command line builds one of these from its flags and hands it to :func:`generate_rows` /
:func:`infill_rows`, which load the model, check the settings against its family and decode. Checks are the
library's (:class:`setdlm.errors.UserError`, worded with the field names); the command line spells the
names as its flags.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..chat import chat_prompt
from ..data.inputs import read_text
from ..data.prompt import check_text
from ..decoding import generate, infill
from ..decoding.output import trace_rows
from ..decoding.settings import DecodeSettings, drafts
from ..decoding.structured import constraint
from ..errors import UserError
from ..formats import pretrained
from ..formats.loading import load
from ..outputs import check_file


@dataclass(frozen=True)
class ModelChoice:
    """Which model decodes: a checkpoint folder, run folder or shipped name (None: the shipped
    ``shakespeare-setdlm-smax8``), its EMA weights or not, the device, the precision and an optional CPU
    quantization."""

    checkpoint: str | None = None
    ema: bool = False
    device: str = "cpu"
    quantize: str | None = None
    dtype: str | None = None

    def load(self):
        return load(self.checkpoint or str(pretrained.path(pretrained.DEFAULT)), ema=self.ema, device=self.device,
                    dtype=self.dtype, quantize=self.quantize)


def constraint_from_flags(regex: str | None = None, json_schema: str | None = None,
                          choice: list[str] | None = None):
    """The :class:`~setdlm.decoding.structured.constraint.Constraint` of ``--regex``, ``--json-schema`` (inline JSON, or
    the path of a file holding it: read here, decoding takes the text) or ``--choice``, at most one of them;
    None for none."""
    given = [n for n, v in (("regex", regex), ("json_schema", json_schema), ("choice", choice)) if v]
    if len(given) > 1:
        raise UserError(f"give one of regex, json_schema, choice, not {' and '.join(given)}",
                        fields=("regex", "json_schema", "choice"))
    if regex:
        return constraint.regex(regex)
    if choice:
        return constraint.choice(choice)
    if not json_schema:
        return None
    if not json_schema.lstrip().startswith("{"):  # a file
        json_schema = read_text(json_schema, "json_schema file", fields=("json_schema",))
    try:
        return constraint.json_schema(json_schema)
    except ValueError as e:
        raise UserError(str(e), fields=("json_schema",)) from None


def _check_requests(requests: list, none: str, output: str | None) -> None:
    """At least one request (else the error ``none``), and an ``output`` file that can be written."""
    if not requests:
        raise UserError(none)
    if output is not None:
        check_file(output)


@dataclass(frozen=True)
class GenerateOptions:
    """``setdlm generate``: ``prompts`` decoded with ``settings`` and ``seed``; ``chat`` sends each prompt as
    a user message through the model's chat template; ``trace`` (a JSON file) records every step's committed
    set and ``show_order`` prints the decode-order view; ``output``: JSONL rows instead of texts."""

    prompts: list[str]
    settings: DecodeSettings = field(default_factory=DecodeSettings)
    model: ModelChoice = field(default_factory=ModelChoice)
    seed: int = 0
    chat: bool = False
    trace: str | None = None
    show_order: bool = False
    output: str | None = None

    def __post_init__(self):
        _check_requests(self.prompts, "no prompts to generate from", self.output)

    @property
    def traced(self) -> bool:
        return bool(self.trace or self.show_order)


@dataclass(frozen=True)
class InfillOptions:
    """``setdlm infill``: ``rows`` of (prefix, suffix, length) filled with ``settings`` and ``seed``;
    ``output``: JSONL rows instead of texts."""

    rows: list[tuple[str, str, int]]
    settings: DecodeSettings = field(default_factory=DecodeSettings)
    model: ModelChoice = field(default_factory=ModelChoice)
    seed: int = 0
    output: str | None = None

    def __post_init__(self):
        _check_requests(self.rows, "no rows to infill", self.output)


def generate_rows(opts: GenerateOptions):
    """Load the model and decode ``opts``: ``(output, rows, tokenizer)``, rows ``{prompt, text, tokens}``
    (and ``steps``, the per-step records, when traced). A prompt must leave room for one new token
    (:func:`setdlm.data.prompt.check_prompt_fits`, checked by ``generate``)."""
    model = opts.model.load()
    opts.settings.check_for(model.family.family, "generate", drafts=drafts(model))
    prompts: list[str] | list[list[int]] = opts.prompts
    if opts.chat:  # each prompt is one user message, rendered by the model's chat template (ids, no extra BOS)
        for i, p in enumerate(opts.prompts):
            check_text(p, f"prompt {i}")
        prompts = [chat_prompt(model.tokenizer, p) for p in opts.prompts]
    # max_new_tokens unset: the one rule, min(256, each prompt's room), which speculation's rows fit too
    out = generate(model, prompts, opts.settings, seed=opts.seed, trace=opts.traced, progress=True)
    assert out.texts is not None  # text prompts: the model has a tokenizer
    rows = [{"prompt": p, "text": t, "tokens": [int(x) for x in ids]}
            for p, t, ids in zip(opts.prompts, out.texts, out.tokens)]
    if opts.traced:
        for row, steps in zip(rows, trace_rows(out, model.tokenizer)):
            row["steps"] = steps
    return out, rows, model.tokenizer


def infill_rows(opts: InfillOptions):
    """Load the model and fill ``opts``: ``(output, rows)``, rows ``{prefix, suffix, length, text, tokens}``."""
    model = opts.model.load()
    opts.settings.check_for(model.family.family, "fill", drafts=drafts(model))
    out = infill(model, [r[0] for r in opts.rows], [r[1] for r in opts.rows], [r[2] for r in opts.rows],
                 settings=opts.settings, seed=opts.seed, progress=True)
    assert out.texts is not None  # text prefixes and suffixes: the model has a tokenizer
    rows = [{"prefix": p, "suffix": s, "length": n, "text": t, "tokens": [int(x) for x in ids]}
            for (p, s, n), t, ids in zip(opts.rows, out.texts, out.tokens)]
    return out, rows
