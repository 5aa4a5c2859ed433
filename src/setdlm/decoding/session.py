"""Step-wise generation: rows join and leave between steps (continuous batching, docs/serve.md).

:func:`setdlm.decoding.generate` decodes a fixed batch to the end. A :class:`Session` decodes the same way
one step at a time, and between two steps

* new rows join: they are prefilled in their own :class:`~setdlm.decoding.state.DecodeState` (the prompt
  cache costs one forward of the new rows only) and appended to the running state
  (:meth:`DecodeState.extend`), so from the next step on they share its forwards;
* finished rows leave at once (:meth:`DecodeState.finish`), and cancelled rows are dropped
  (:meth:`DecodeState.select`).

Every row keeps its own seed (one generator per row), cache and stopping rules, so a row's tokens are those
of ``generate(model, [prompt], seed=seed, ...)`` alone, whatever joins or leaves around it; and a row whose
decode raises fails alone (:meth:`Session.step`). Rows decode
in one batch only with rows of the same settings (the same :class:`DecodeConfig`: sampling, threshold,
window, stop strings ...); a session runs one group per distinct setting, each one forward per step.
A row's output constraint (docs/decoding.md "Constrained decoding") is its own, not part of the config:
rows with different constraints, or none, share a group.
Every canvas has the same width (``width``, default the context length ``L``), so that states built apart
can be joined; a row must therefore fit: prompt + ``max_new_tokens`` <= ``width``.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, fields, replace

import torch

from ..data.prompt import check_prompt_fits, encode_prompts
from ..errors import UserError
from .api import decode_config, decoder_of, device_of, needs_seed, row_seeds, row_text, start
from .output import StepTrace
from .settings import DecodeSettings, default_max_new_tokens, drafts
from .state import DecodeConfig, DecodeState, Mode
from .structured.cfg import GrammarRow, left_to_right
from .structured.constraint import ConstraintCompiler
from .structured.enforce import RowConstraint, row_constraints


@dataclass
class RowDone:
    """A finished row, as :class:`~setdlm.decoding.GenerationOutput` would report it alone."""

    tokens: list[int]  # generated tokens (an ending EOS or stop string's tokens included, as generate)
    text: str | None  # the text (EOS and stop string excluded); None without a tokenizer
    finish_reason: str  # "eos" | "stop" | "length" (GenerationOutput's)
    nfe: int  # forwards this row took part in (prefill excluded)
    committed: int  # tokens committed, including any past an EOS or stop string


@dataclass
class RowStep:
    """What one step did to one row: its trace entry, and the result when the row finished there."""

    row: int  # the id :meth:`Session.add` returned
    step: int  # the row's own step index, from 0
    trace: StepTrace | None  # None when the step failed
    done: RowDone | None = None
    error: str | None = None  # the row's decode failed (one line); it left the session


@dataclass
class Row:
    """One prepared row: its canvas (prompt, then MASK × max_new_tokens, then the suffix of an infilling
    row), config and seed."""

    sequence: list[int]
    config: DecodeConfig
    seed: int | None
    prompt_length: int
    trace: list[StepTrace] | None = None  # the state's trace list of this row, once it joined
    constraint: RowConstraint | GrammarRow | None = None  # its output constraint, compiled
    suffix_length: int = 0  # an infilling row: the middle lies between prompt and suffix

    def targets(self) -> list[bool]:
        """The positions it decodes: the MASKs after the prompt (and before the suffix)."""
        end = len(self.sequence) - self.suffix_length
        return [self.prompt_length <= i < end for i in range(len(self.sequence))]


class Session:
    """Rows of ``model`` decoded step by step; :meth:`add` rows at any time, call :meth:`step` to advance.

    Not thread-safe: one thread drives a session (the server's decoding loop). Puts the backbone in eval
    mode. ``compiler``: the :class:`~setdlm.decoding.structured.constraint.ConstraintCompiler` that compiles its rows'
    constraints (default the library's)."""

    def __init__(self, model, *, width: int | None = None, compiler: ConstraintCompiler | None = None):
        self.model = model
        self.compiler = compiler
        model.backbone.eval()
        self.width = width if width is not None else model.family.length
        if not (isinstance(self.width, int) and self.width >= 2):
            raise UserError(f"width must be an integer >= 2, got {self.width!r}")
        self.device = device_of(model.backbone)
        self.groups: dict[tuple, DecodeState] = {}  # config key → the running rows of that config
        self.pending: list[int] = []  # rows added, joining at the next step
        self.rows: dict[int, Row] = {}
        self.next_id = 0
        self.forwards = 0  # decoding forwards of the session (prefill excluded), every group counted

    def __len__(self) -> int:
        """Rows not finished yet (running and pending)."""
        return len(self.rows)

    def add(self, prompt, **kwargs) -> int:
        """Queue one prompt (string or token ids) with :func:`~setdlm.decoding.generate`'s settings
        (:func:`prepare`); it joins the batch at the next :meth:`step`. Returns the row's id."""
        return self.add_prepared(prepare(self.model, prompt, width=self.width, compiler=self.compiler, **kwargs))

    def add_prepared(self, row: Row) -> int:
        """Queue a row made by :func:`prepare` (which may run in another thread); returns its id."""
        if len(row.sequence) > self.width:
            raise UserError(f"the row has {len(row.sequence)} positions, more than the canvas width {self.width}")
        rid = self.next_id
        self.next_id += 1
        self.rows[rid] = replace(row, trace=None)  # a copy: the trace list is this session's
        self.pending.append(rid)
        return rid

    def cancel(self, row: int) -> None:
        """Drop a row (pending or running), e.g. when its client went away. Unknown ids are ignored."""
        r = self.rows.pop(row, None)
        if r is None:
            return
        if row in self.pending:
            self.pending.remove(row)
            return
        for key, st in list(self.groups.items()):
            keep = torch.nonzero(st.index != row).flatten()
            if keep.numel() < st.batch:
                st.select(keep.to(st.device))
                if st.batch == 0:
                    del self.groups[key]

    def step(self) -> list[RowStep]:
        """Admit the pending rows, then run one forward per group; returns one :class:`RowStep` per row that
        took part (finished rows carry ``done`` and leave the session). A step that raises fails only the rows
        whose step fails alone (their events carry ``error`` and they leave); every other row of the group
        gets the step it would have had, and the other groups go on."""
        events = self._admit()
        with torch.inference_mode():
            for key, st in list(self.groups.items()):
                ids = st.index.tolist()
                steps = {row: len(self._trace(row)) for row in ids}  # steps each row completed before
                try:
                    self._advance(st)
                except Exception as e:  # the group's state is spent: each row is stepped again alone
                    del self.groups[key]
                    built, failed = self._one_by_one(ids, e, lambda row, steps=steps: self._replay(row, steps[row]),
                                                      steps)
                    events += failed
                    for row, new in built:
                        events += self._report(new, [row])
                        if new.batch:
                            self._join(key, new)
                    continue
                events += self._report(st, ids)
                if st.batch == 0:
                    del self.groups[key]
        return events

    def _advance(self, st: DecodeState) -> None:
        """One decoding step of ``st``; the rows it finished leave the state (into ``st.results``)."""
        decoder_of(self.model.family, st.cfg).step(self.model.backbone, st)
        st.finish()
        self.forwards += 1

    def _report(self, st: DecodeState, rows: list[int]) -> list[RowStep]:
        """One event per row of ``rows`` for the step ``st`` just took; the rows it finished leave the session."""
        events = []
        for row in rows:
            r, trace = self.rows[row], self._trace(row)
            ev = RowStep(row, len(trace) - 1, trace[-1])
            res = st.results.pop(row, None)
            if res is not None:
                text = row_text(self.model.tokenizer, res, r.config.stop) if self.model.tokenizer else None
                ev.done = RowDone(res.tokens, text, res.finish_reason, len(trace), res.committed)
                del self.rows[row]
            events.append(ev)
        return events

    def _trace(self, row: int) -> list[StepTrace]:
        """The trace of a row that joined a state (a session's configs trace every row)."""
        trace = self.rows[row].trace
        if trace is None:
            raise RuntimeError(f"row {row} has not joined a state")
        return trace

    def _replay(self, row: int, steps: int) -> DecodeState:
        """``row`` alone, decoded afresh from its prompt and seed through ``steps`` + 1 steps: the state its
        group's failed step would have left it in, exactly (a row decodes alone as it does in any batch: its
        own generator, cache and stopping), with the same trace. Nothing is kept per step for this: it costs
        ``steps`` + 1 one-row forwards, and only after a failure (a group's state may be half-written then)."""
        st = self._prefill([row])
        self.rows[row].trace = _traces(st)[0]
        for _ in range(steps + 1):
            self._advance(st)
        return st

    def _one_by_one(self, rows: list[int], e: Exception, build, steps: dict[int, int] | None = None):
        """After ``e`` failed ``rows`` together: ``build(row)`` each row's state alone, so that only the rows that
        fail alone fail (one event each; ``steps``: each row's steps before the failed one). Returns the built
        ``(row, state)`` pairs and the failures' events."""
        if len(rows) == 1:  # it failed alone already
            return [], self._fail(rows, e, steps)
        built, failed = [], []
        for row in rows:
            try:
                built.append((row, build(row)))
            except Exception as e1:
                failed += self._fail([row], e1, steps)
        return built, failed

    def _fail(self, rows: list[int], e: Exception, steps: dict[int, int] | None = None) -> list[RowStep]:
        """Drop ``rows`` after a failure (at step ``steps[row]``, 0 by default: the prefill); one event each,
        carrying the error's first line."""
        first = (str(e).splitlines() or [""])[0]
        out = []
        for row in rows:
            self.rows.pop(row)
            out.append(RowStep(row, (steps or {}).get(row, 0), None,
                               error=f"decoding failed: {type(e).__name__}: {first}"))
        return out

    def _admit(self) -> list[RowStep]:
        """Prefill the pending rows, one state per config, and join each to its running group. A prefill that
        raises is retried row by row (:meth:`_one_by_one`), so that only the rows that fail alone fail;
        returns their events."""
        if not self.pending:
            return []
        by_key: dict[tuple, list[int]] = {}
        for row in self.pending:
            by_key.setdefault(_key(self.rows[row].config), []).append(row)
        self.pending = []
        failed = []
        with torch.inference_mode():
            for key, rows in by_key.items():
                try:
                    self._join(key, self._prefill(rows))
                except Exception as e:
                    built, fails = self._one_by_one(rows, e, lambda row: self._prefill([row]))
                    failed += fails
                    for _, new in built:
                        self._join(key, new)
        return failed

    def _prefill(self, rows: list[int]) -> DecodeState:
        """A new state of ``rows`` (one config), prefilled; touches no session state until joined. Each row's
        constraint is copied: it tracks its state's progress, and a row may start again (:meth:`_replay`)."""
        rs = [self.rows[i] for i in rows]
        seeds = [r.seed for r in rs if r.seed is not None]  # all or none: the rows of one config
        if seeds and len(seeds) != len(rs):
            raise RuntimeError("rows of one config must all be seeded or none")
        gens = [torch.Generator(device=self.device).manual_seed(s) for s in seeds] if seeds else None
        cons = [copy.copy(r.constraint) for r in rs] if any(r.constraint for r in rs) else None
        new = DecodeState([r.sequence for r in rs], [r.targets() for r in rs], rs[0].config, index=rows,
                          generators=gens, device=self.device, width=self.width, constraints=cons)
        start(self.model.backbone, new, self.model.family)
        return new

    def _join(self, key: tuple, new: DecodeState) -> None:
        for row, tr in zip(new.index.tolist(), _traces(new)):
            self.rows[row].trace = tr
        if key in self.groups:
            self.groups[key].extend(new)
        else:
            self.groups[key] = new


def prepare(model, prompt, settings: DecodeSettings | None = None, *, width: int | None = None,
            seed: int | None = None, suffix=None, compiler: ConstraintCompiler | None = None, **knobs) -> Row:
    """Encode and validate one row for a session of canvas ``width`` (default ``L``), with the settings and
    defaults of :func:`~setdlm.decoding.generate` (``settings=`` or keywords); invalid settings raise
    ValueError. A sampled row without a seed gets one drawn here (from torch's global RNG, as ``generate``).
    With a ``suffix`` (text or token ids) the row infills: ``prompt + [MASK] × max_new_tokens + suffix``,
    decoded as :func:`~setdlm.decoding.infill` decodes it (docs/method.md §4.6; generate-only settings
    such as ``stop`` are a ValueError); a constraint compiles with ``compiler`` (default the library's).
    Touches no session state."""
    settings = DecodeSettings.of(settings, knobs, "prepare")
    mode: Mode = "generate" if suffix is None else "fill"
    cache_order, given = settings.cache_order or "position", settings.max_new_tokens
    if mode == "fill":
        settings = replace(settings, max_new_tokens=None)
    settings.check_for(model.family.family, mode, drafts=drafts(model))
    width = width if width is not None else model.family.length
    fam = model.family
    (ids,) = encode_prompts(model, [prompt], "prompt", add_bos=True)
    suf = [] if suffix is None else encode_prompts(model, [suffix], "suffix", allow_empty=True)[0]
    if fam.mask_token_id in ids or fam.mask_token_id in suf:
        raise UserError(f"the {'prompt' if fam.mask_token_id in ids else 'suffix'} contains the MASK id "
                         f"{fam.mask_token_id}")
    check_prompt_fits(len(ids) + len(suf), width, "prompt + suffix" if suf else "prompt")
    max_new_tokens = given or default_max_new_tokens("generate", room=width - len(ids) - len(suf))
    if len(ids) + max_new_tokens + len(suf) > width:
        raise UserError(f"prompt ({len(ids)} tokens) + max_new_tokens ({max_new_tokens})"
                         f"{f' + suffix ({len(suf)} tokens)' if suf else ''} exceed the context length {width}")
    cfg = decode_config(model, settings, mode=mode, cache_order=cache_order, trace=True)
    if fam.spec.reveal_cache_order and cache_order == "reveal" and max_new_tokens > fam.length:
        raise UserError(f"cache_order='reveal' needs max_new_tokens <= L={fam.length}, got {max_new_tokens}")
    seeds = row_seeds(seed, 1, needs_seed(fam, cfg))
    row = Row(ids + [fam.mask_token_id] * max_new_tokens + suf, cfg, seeds[0] if seeds else None, len(ids),
              suffix_length=len(suf))
    eos = cfg.sampling.eos_token_ids if cfg.stop_on_eos else ()
    (row.constraint,) = row_constraints(settings.constraints(1), [row.sequence], [row.targets()], mode,
                                        model.tokenizer, eos, left_to_right(fam.spec, cfg), compiler) or [None]
    return row


def _traces(st: DecodeState) -> list[list[StepTrace]]:
    """The traces of a session's state (its configs trace every row)."""
    if st.traces is None:
        raise RuntimeError("a session's state keeps its rows' traces")
    return st.traces


def _key(cfg: DecodeConfig) -> tuple:
    """Rows decode in one state only with an equal config: its fields, the tokenizer by identity."""
    return tuple(id(v) if f.name == "tokenizer" else v for f in fields(cfg) for v in [getattr(cfg, f.name)])

