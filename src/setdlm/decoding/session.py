"""Step-wise generation: rows join and leave between steps (continuous batching, docs/serve.md).

:func:`setdlm.decoding.generate` decodes a fixed batch to the end. A :class:`Session` decodes the same way
one step at a time, and between two steps

* new rows join: they are prefilled in their own :class:`~setdlm.decoding.state.DecodeState` (the prompt
  cache costs one forward of the new rows only) and appended to the running state
  (:meth:`DecodeState.extend`), so from the next step on they share its forwards;
* finished rows leave at once (:meth:`DecodeState.finish`), and cancelled rows are dropped
  (:meth:`DecodeState.select`).

Every row keeps its own seed (one generator per row), cache and stopping rules, so a row's tokens are those
of ``generate(model, [prompt], seed=seed, ...)`` alone, whatever joins or leaves around it. Rows decode
in one batch only with rows of the same settings (the same :class:`DecodeConfig`: sampling, threshold,
window, stop strings ...); a session runs one group per distinct setting, each one forward per step.
A row's output constraint (docs/decoding.md "Constrained decoding") is its own, not part of the config:
rows with different constraints, or none, share a group.
Every canvas has the same width (``width``, default the context length ``L``), so that states built apart
can be joined; a row must therefore fit: prompt + ``max_new_tokens`` <= ``width``.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

import torch

from .api import DECODERS, _device, _encode_all, _seeds, _text, decode_config, needs_seed, start
from .constrained import RowConstraint, row_constraints
from .output import StepTrace
from .settings import DEFAULT_MAX_NEW_TOKENS, DecodeSettings
from .state import DecodeConfig, DecodeState


@dataclass
class RowDone:
    """A finished row, as :class:`~setdlm.decoding.GenerationOutput` would report it alone."""

    tokens: list[int]  # generated tokens (an ending EOS or stop string's tokens included, as generate)
    text: str | None  # the text (EOS and stop string excluded); None without a tokenizer
    finish_reason: str  # "eos" | "stop" | "length"
    nfe: int  # forwards this row took part in (prefill excluded)
    committed: int  # tokens committed, including any past an EOS or stop string


@dataclass
class RowStep:
    """What one step did to one row: its trace entry, and the result when the row finished there."""

    row: int  # the id :meth:`Session.add` returned
    step: int  # the row's own step index, from 0
    trace: StepTrace
    done: RowDone | None = None


@dataclass
class Row:
    """One prepared row: its canvas (prompt, then MASK × max_new_tokens), config and seed."""

    sequence: list[int]
    config: DecodeConfig
    seed: int | None
    prompt_length: int
    trace: list[StepTrace] | None = None  # the state's trace list of this row, once it joined
    constraint: RowConstraint | None = None  # its output constraint, compiled (rows of any constraint share a state)


class Session:
    """Rows of ``model`` decoded step by step; :meth:`add` rows at any time, call :meth:`step` to advance.

    Not thread-safe: one thread drives a session (the server's decoding loop). Puts the backbone in eval
    mode."""

    def __init__(self, model, *, width: int | None = None):
        self.model = model
        model.backbone.eval()
        self.width = width if width is not None else model.family.length
        if not (isinstance(self.width, int) and self.width >= 2):
            raise ValueError(f"width must be an integer >= 2, got {self.width!r}")
        self.device = _device(model.backbone)
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
        return self.add_prepared(prepare(self.model, prompt, width=self.width, **kwargs))

    def add_prepared(self, row: Row) -> int:
        """Queue a row made by :func:`prepare` (which may run in another thread); returns its id."""
        if len(row.sequence) > self.width:
            raise ValueError(f"the row has {len(row.sequence)} positions, more than the canvas width {self.width}")
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
        took part (finished rows carry ``done`` and leave the session)."""
        self._admit()
        events = []
        decoders = DECODERS[self.model.family.family]
        with torch.inference_mode():
            for key, st in list(self.groups.items()):
                ids = st.index.tolist()
                decoders.step(self.model.backbone, st)
                self.forwards += 1
                st.finish()
                for row in ids:
                    r = self.rows[row]
                    ev = RowStep(row, len(r.trace) - 1, r.trace[-1])
                    if row in st.results:
                        res = st.results.pop(row)
                        text = _text(self.model.tokenizer, res, r.config.stop) if self.model.tokenizer else None
                        ev.done = RowDone(res.tokens, text, res.finish_reason, len(r.trace), res.committed)
                        del self.rows[row]
                    events.append(ev)
                if st.batch == 0:
                    del self.groups[key]
        return events

    def _admit(self) -> None:
        """Prefill the pending rows, one state per config, and join each to its running group."""
        if not self.pending:
            return
        by_key: dict[tuple, list[int]] = {}
        for row in self.pending:
            by_key.setdefault(_key(self.rows[row].config), []).append(row)
        self.pending = []
        fam = self.model.family
        with torch.inference_mode():
            for key, rows in by_key.items():
                rs = [self.rows[i] for i in rows]
                gens = None
                if rs[0].seed is not None:
                    gens = [torch.Generator(device=self.device).manual_seed(r.seed) for r in rs]
                targets = [[i >= r.prompt_length for i in range(len(r.sequence))] for r in rs]
                new = DecodeState([r.sequence for r in rs], targets, rs[0].config, index=rows, generators=gens,
                                  device=self.device, width=self.width,
                                  constraints=[r.constraint for r in rs] if any(r.constraint for r in rs) else None)
                start(self.model.backbone, new, fam)
                for r, tr in zip(rs, new.traces):
                    r.trace = tr
                if key in self.groups:
                    self.groups[key].extend(new)
                else:
                    self.groups[key] = new


def prepare(model, prompt, settings: DecodeSettings | None = None, *, width: int | None = None,
            seed: int | None = None, **knobs) -> Row:
    """Encode and validate one row for a session of canvas ``width`` (default ``L``), with the settings and
    defaults of :func:`~setdlm.decoding.generate` (``settings=`` or keywords); invalid settings raise
    ValueError. A sampled row without a seed gets one drawn here (from torch's global RNG, as ``generate``).
    Touches no session state."""
    settings = DecodeSettings.of(settings, knobs, "prepare")
    settings.check_for(model.family.family)
    width = width if width is not None else model.family.length
    fam = model.family
    max_new_tokens, cache_order = settings.max_new_tokens or DEFAULT_MAX_NEW_TOKENS, settings.cache_order or "position"
    (ids,) = _encode_all(model, [prompt], "prompt", add_bos=True)
    if fam.mask_token_id in ids:
        raise ValueError(f"the prompt contains the MASK id {fam.mask_token_id}")
    if len(ids) + max_new_tokens > width:
        raise ValueError(f"prompt ({len(ids)} tokens) + max_new_tokens ({max_new_tokens}) exceed the context "
                         f"length {width}")
    if seed is not None and not (isinstance(seed, int) and not isinstance(seed, bool)):
        raise ValueError(f"seed must be an integer, got {seed!r}")
    cfg = decode_config(model, settings, mode="generate", cache_order=cache_order, trace=True)
    if fam.family == "setdlm" and cache_order == "reveal" and max_new_tokens > fam.length:
        raise ValueError(f"cache_order='reveal' needs max_new_tokens <= L={fam.length}, got {max_new_tokens}")
    seeded = needs_seed(fam, cfg)
    sequence = ids + [fam.mask_token_id] * max_new_tokens
    target = [False] * len(ids) + [True] * max_new_tokens
    (constraint,) = row_constraints(settings.constraints(1), [sequence], [target], "generate", model.tokenizer,
                                    cfg.sampling.eos_token_ids if cfg.stop_on_eos else ()) or [None]
    return Row(sequence, cfg, _seeds(seed, 1)[0] if seeded else None, len(ids), constraint=constraint)


def _key(cfg: DecodeConfig) -> tuple:
    """Rows decode in one state only with an equal config: its fields, the tokenizer by identity."""
    return tuple(id(v) if f.name == "tokenizer" else v for f in fields(cfg) for v in [getattr(cfg, f.name)])

