"""Batched per-row decoding state shared by every decoder (docs/method.md §4.2, §4.5, §4.6, §4.9).

Every decoder works on a *canvas*: one row per sequence holding its tokens at their absolute positions,
MASK where a token is still to be decoded. ``generate`` builds ``[prompt, MASK × max_new_tokens]``; infilling builds
``[prefix, MASK × m, suffix]`` (or any sequence with MASK tokens at arbitrary positions). Rows are
ragged: row ``b`` owns positions ``0..length[b]-1``. ``N`` (``DecodeState.canvas``) is the canvas width, the
widest row (not the BD3LM block size ``S``); column ``N`` (one past the widest row) is a trash
column where writes of padded or uncommitted slots land, so that no scatter ever collides.

A decoder step builds its backbone input as a list of canvas positions per row (``slot_pos``, padded with
the trash column), runs one forward through :func:`forward`, and hands the logits of its query slots to
:meth:`DecodeState.commit`. Finished rows leave the batch (``KVCache.select_rows``) so they stop costing
compute.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import TYPE_CHECKING, Literal, Protocol

import torch
from torch import Tensor

from ..masks import decode_block_mask, with_cache
from ..model import KVCache
from .output import StepTrace
from .sampling import Sampling, commit_rule, process_logits, propose
from .structured.cfg import GrammarRow
from .structured.enforce import RowConstraint, allowed_tokens, keep_jointly, vet_commits

if TYPE_CHECKING:
    from .settings import VerifyLayout


Mode = Literal["generate", "fill"]  # generate: new tokens after a prompt; fill: the MASKs of a canvas (infill)


class TextOf(Protocol):
    """What a decode reads of its tokenizer: the text of token ids (stop strings)."""

    def decode(self, ids: list[int], /) -> str: ...


class Decoder(Protocol):
    """A decoder (the modules ``setdlm.decoding.ar``, ``mdlm``, ``bd3lm``, ``setdlm``, ``speculative``,
    ``speculative_next_token``, ``speculative_drafter``): ``init`` gives a new state its cache and per-row tensors
    (its :class:`RowTensors`), ``step`` advances every row of the state by one forward."""

    def init(self, backbone, st: DecodeState) -> None: ...

    def step(self, backbone, st: DecodeState) -> None: ...


@dataclass
class DecodeConfig:
    """Everything a decoder needs besides the backbone and the rows."""

    sampling: Sampling
    context_length: int  # L: the cache never holds more than L − (new tokens) entries (docs/method.md §4.5)
    mode: Mode = "generate"  # "generate" (stop on EOS / stop strings) or "fill" (stop when no MASK is left)
    stop_on_eos: bool = True  # generate: a row ends at its first EOS (sampling.eos_token_ids)
    window: int = 1  # SetDLM positional window w
    block_size: int = 1  # BD3LM block S / MDLM sub-block
    cache_order: str = "position"  # SetDLM: order of newly cached tokens, "position" or "reveal"
    speculate: bool | str = False  # SetDLM: self-speculative decoding (True: decoding/speculative.py, "next_token":
    # decoding/speculative_next_token.py)
    verify_layout: VerifyLayout = "auto"  # speculate=True: "auto", "all" or "last" (decoding/speculative.py)
    stop: tuple[str, ...] = ()
    tokenizer: TextOf | None = None
    trace: bool = False
    top_logprobs: int = 0  # with ``trace``: each query's k most probable tokens (StepTrace.top; the server's logprobs)


@dataclass
class RowTensors:
    """A decoder's own per-row tensors (first dim = rows), selected and joined with the state's rows: each
    decoder declares them as the fields of a subclass (``SetDLMRows``: ``pending``, ``pend_key``, ...)."""

    def select(self, rows: Tensor) -> RowTensors:
        return replace(self, **{f.name: getattr(self, f.name)[rows] for f in fields(self)})

    def join(self, other: RowTensors) -> RowTensors:
        if type(other) is not type(self):
            raise ValueError(f"decoder state mismatch: {type(self).__name__} vs {type(other).__name__}")
        return replace(self, **{f.name: torch.cat([getattr(self, f.name), getattr(other, f.name)])
                                for f in fields(self)})


@dataclass
class RowResult:
    tokens: list[int]
    sequence: list[int]
    finish_reason: str  # "eos" | "stop" | "length" | "done" (GenerationOutput's)
    nfe: int
    committed: int
    trace: list[StepTrace] | None


class DecodeState:
    """The rows still being decoded, with their canvas, cache and bookkeeping (first dim = rows)."""

    # the per-row tensors every row has (first dim = rows), selected and joined together
    ROW_TENSORS = ("tokens", "target", "masked", "length", "gen_start", "first_masked", "eos_pos", "stop_checked",
                   "stop_end")

    def __init__(self, sequences: list[list[int]], targets: list[list[bool]], cfg: DecodeConfig, *,
                 index: list[int], generators: list[torch.Generator] | None, device, width: int | None = None,
                 constraints: list[RowConstraint | GrammarRow | None] | None = None):
        B = len(sequences)
        N = max(len(s) for s in sequences)
        if width is not None:  # a fixed canvas, so that states built apart can be joined (:meth:`extend`)
            if width < N:
                raise ValueError(f"canvas width {width} is narrower than the longest row ({N})")
            N = width
        mask_id = cfg.sampling.mask_token_id
        self.cfg = cfg
        self.canvas = N
        self.device = device
        self.tokens = torch.full((B, N + 1), mask_id, dtype=torch.long, device=device)  # (B, N+1)
        self.target = torch.zeros(B, N + 1, dtype=torch.bool, device=device)  # positions to decode
        for b, (seq, tgt) in enumerate(zip(sequences, targets)):
            self.tokens[b, : len(seq)] = torch.tensor(seq, dtype=torch.long)
            self.target[b, : len(tgt)] = torch.tensor(tgt, dtype=torch.bool)
        self.masked = self.target.clone()  # (B, N+1) still MASK
        self.length = torch.tensor([len(s) for s in sequences], dtype=torch.long, device=device)  # (B,)
        self.gen_start = torch.tensor([t.index(True) if any(t) else len(t) for t in targets], device=device)
        self.index = torch.tensor(index, dtype=torch.long)  # (B,) rows of the caller's batch (CPU)
        self.generators = generators
        self.pos = torch.arange(N + 1, device=device)  # (N+1,)
        self.first_masked = self._first_masked()  # (B,) f, or N when nothing is masked
        self.eos_pos = torch.full((B,), N, dtype=torch.long, device=device)  # first committed EOS
        self.stop_checked = self.gen_start.clone()  # resolved prefix already searched for stop strings
        self.stop_end = torch.full((B,), N, dtype=torch.long, device=device)  # end of a found stop string
        self.seen: Tensor | None = None  # (B, V) counts for the repetition penalty, built on first use
        self.extra = RowTensors()  # the decoder's own per-row tensors (its init sets its RowTensors subclass)
        self.shared: dict[str, Tensor] = {}  # tensors shared by all rows (the decoders add their own)
        self.cache: KVCache | None = None  # the decoder's init makes it (:attr:`kv`)
        # speculative decodes: a step's predictions' alternatives (values, indices, positions, horizons, valid),
        # from predict to verify's trace
        self.step_top: tuple[Tensor, Tensor, Tensor, Tensor, Tensor] | None = None
        self.forwards = 0  # steps so far (every row still here took part in all of them)
        self.may_overflow = N > cfg.context_length  # cache + new tokens <= N distinct positions otherwise
        self.traces: list[list[StepTrace]] | None = [[] for _ in range(B)] if cfg.trace else None
        self.results: dict[int, RowResult] = {}
        # per row, a RowConstraint (docs/decoding.md "Constrained decoding") or None; None: no row has one
        self.constraints: list[RowConstraint | GrammarRow | None] | None = (
            list(constraints) if constraints is not None else None)
        ends = cfg.stop_on_eos and cfg.mode == "generate"  # the EOS ids that end a row, made once
        self.shared["stop_ids"] = torch.tensor(cfg.sampling.eos_token_ids if ends else (), dtype=torch.long,
                                               device=device)

    # -- bookkeeping -----------------------------------------------------------------------------------------

    @property
    def batch(self) -> int:
        return self.length.shape[0]

    @property
    def kv(self) -> KVCache:
        """The cache, which the decoder's ``init`` made (a decoder without one never asks)."""
        if self.cache is None:
            raise RuntimeError("the decoder's init has not made the state's cache")
        return self.cache

    def _first_masked(self) -> Tensor:
        return torch.where(self.masked, self.pos, self.canvas).min(-1).values  # (B,)

    def select(self, rows: Tensor) -> None:
        """Keep only ``rows`` (a (B',) index), e.g. after some rows finished."""
        for name in self.ROW_TENSORS:
            setattr(self, name, getattr(self, name)[rows])
        if self.seen is not None:
            self.seen = self.seen[rows]
        self.extra = self.extra.select(rows)
        keep = rows.tolist()
        self.index = self.index[rows.cpu()]
        if self.generators is not None:
            self.generators = [self.generators[i] for i in keep]
        if self.traces is not None:
            self.traces = [self.traces[i] for i in keep]
        if self.constraints is not None:
            self.constraints = [self.constraints[i] for i in keep]
        if self.cache is not None:
            self.cache.select_rows(rows)

    def extend(self, other: DecodeState) -> None:
        """Append the rows of ``other`` (same config and canvas width, its decoder already initialised) to
        this state, between two steps: continuous batching (docs/serve.md). Every per-row tensor, the
        cache, the generators and the traces are concatenated; each row keeps decoding exactly as alone."""
        if other.canvas != self.canvas or other.cfg != self.cfg:
            raise ValueError("only states with the same decoding config and canvas width can be joined")
        for name in self.ROW_TENSORS:
            setattr(self, name, torch.cat([getattr(self, name), getattr(other, name)]))
        counted = self.seen if self.seen is not None else other.seen
        if counted is not None:  # one side may not have committed yet: start its counts
            self.seen = self.seen if self.seen is not None else self._initial_seen(counted.shape[-1])
            other.seen = other.seen if other.seen is not None else other._initial_seen(counted.shape[-1])
            self.seen = torch.cat([self.seen, other.seen])
        self.extra = self.extra.join(other.extra)
        self.index = torch.cat([self.index, other.index])
        if self.generators is not None and other.generators is not None:  # both or neither: the same config
            self.generators = self.generators + other.generators
        if self.traces is not None and other.traces is not None:
            self.traces = self.traces + other.traces
        if self.constraints is not None or other.constraints is not None:
            self.constraints = ((self.constraints or [None] * (self.batch - other.batch))
                                + (other.constraints or [None] * other.batch))
        if self.cache is not None and other.cache is not None:
            self.cache.cat_rows(other.cache)
        self.results.update(other.results)

    # -- one step's commit ---------------------------------------------------------------------------------

    def commit(self, logits: Tensor, qpos: Tensor, qvalid: Tensor, slot_pos: Tensor, slot_valid: Tensor) -> Tensor:
        """Apply the commit rule to query logits (B, Q, V) at canvas positions ``qpos`` (B, Q) with
        ``qvalid`` (B, Q); write the committed tokens. ``slot_pos``/``slot_valid`` (B, T): the step's input
        (for the trace). Returns the write index (B, Q): the committed position, or the trash column ``N``
        where nothing was committed."""
        s = self.cfg.sampling
        gen_len = None
        if s.length_penalty is not None:
            done = self.target & ~self.masked  # (B, N+1) generated tokens already visible
            gen_len = done.cumsum(-1).gather(1, qpos)  # queries are masked: the count is exclusive
        if s.repetition_penalty != 1.0 and self.seen is None:
            self.seen = self._initial_seen(logits.shape[-1])
        rows, allowed = self.constraints, None
        if rows is not None:  # (B, Q, V) the tokens that keep each row's canvas completable
            allowed = allowed_tokens(rows, self.tokens, self.masked, qpos, qvalid, logits.shape[-1])
        tok, conf = propose(logits, qvalid, s, self.generators, self.seen, gen_len, allowed)  # (B, Q) each
        commit = commit_rule(conf, qvalid, s.threshold)  # (B, Q)
        bound = None  # (B, Q) where the constraint overrode the model's own first choice (for the trace)
        if rows is not None and allowed is not None:  # a set is kept only as far as its members fit together
            commit = keep_jointly(rows, self.tokens, self.masked, qpos, tok, conf, commit)
            # where a CFG row put its closing's next token instead (docs/decoding.md "Two engines")
            replaced = vet_commits(rows, qpos, tok, commit)
            if self.traces is not None:
                free = logits.index_fill(-1, torch.tensor([s.mask_token_id], device=logits.device), float("-inf"))
                bound = ~allowed.gather(-1, free.argmax(-1, keepdim=True))[..., 0] | replaced
        top = None  # (values, indices) (B, Q, k): the k most probable tokens of each query's distribution
        if self.cfg.top_logprobs and self.traces is not None:
            top = process_logits(logits, s, self.seen, gen_len, allowed).topk(self.cfg.top_logprobs, dim=-1)
        write = self.write(tok, conf, commit, qpos, qvalid, slot_pos, slot_valid, bound)
        if top is not None:
            self.trace_top(top, qpos, qvalid)
        return write

    def trace_top(self, top, qpos: Tensor, qvalid: Tensor) -> None:
        """Each query's k most probable tokens and their log-probabilities under the distribution its token was
        proposed from (``top``: values, indices (B, Q, k)), into the step's trace in query-position order."""
        values, indices = top
        if self.traces is None:
            return
        for b in range(self.batch):
            v = qvalid[b]
            order = torch.argsort(qpos[b][v])
            self.traces[b][-1].top = [list(zip(i, lp)) for i, lp in zip(indices[b][v][order].tolist(),
                                                                         values[b][v][order].double().tolist())]

    def write(self, tok: Tensor, conf: Tensor, commit: Tensor, qpos: Tensor, qvalid: Tensor, slot_pos: Tensor,
              slot_valid: Tensor, bound: Tensor | None = None) -> Tensor:
        """Write the tokens ``tok`` (B, Q) of the queries at ``qpos`` where ``commit`` (B, Q), and count the
        step (the second half of :meth:`commit`); ``bound`` (B, Q): where a constraint chose the token, for the
        trace. Returns the write index (B, Q)."""
        write = torch.where(commit, qpos, self.canvas)  # (B, Q)
        self.tokens.scatter_(1, write, tok)
        self.masked.scatter_(1, write, False)
        if self.seen is not None:
            self.seen.scatter_add_(1, tok, commit.long())
        if self.shared["stop_ids"].numel():
            is_eos = commit & torch.isin(tok, self.shared["stop_ids"])
            self.eos_pos = torch.minimum(self.eos_pos, torch.where(is_eos, qpos, self.canvas).min(-1).values)
        self.forwards += 1
        self.first_masked = self._first_masked()
        if self.traces is not None:
            self._trace(qpos, qvalid, tok, conf, commit, slot_pos, slot_valid, bound)
        return write

    def _initial_seen(self, V: int) -> Tensor:
        """Token counts the repetition penalty starts from: nothing when generating (the penalty covers
        the generated span, docs/method.md §4.3), every visible context token when infilling."""
        seen = torch.zeros(self.batch, V, dtype=torch.long, device=self.device)
        if self.cfg.mode == "fill":
            ctx = (~self.target & (self.pos < self.length[:, None]))[:, : self.canvas]  # (B, N)
            seen.scatter_add_(1, self.tokens[:, : self.canvas], ctx.long())
        return seen

    def _trace(self, qpos: Tensor, qvalid: Tensor, tok: Tensor, conf: Tensor, commit: Tensor, slot_pos: Tensor,
               slot_valid: Tensor, bound: Tensor | None = None) -> None:
        if self.traces is None:
            return
        cache_len = self.cache.lengths.tolist() if self.cache is not None else [0] * self.batch
        for b in range(self.batch):
            v, c = qvalid[b], commit[b]
            ins = slot_pos[b][slot_valid[b]].tolist()
            order = torch.argsort(qpos[b][v])
            cpos, ctok = qpos[b][c], tok[b][c]
            corder = torch.argsort(cpos)
            forced = [] if bound is None else sorted(qpos[b][c & bound[b]].tolist())
            self.traces[b].append(StepTrace(
                input_positions=ins, query_positions=qpos[b][v][order].tolist(),
                candidates=tok[b][v][order].tolist(), confidences=conf[b][v][order].tolist(),
                committed_positions=cpos[corder].tolist(), committed_tokens=ctok[corder].tolist(),
                cache_length=cache_len[b], constrained_positions=forced))

    # -- stopping (docs/method.md §4.4) ------------------------------------------------------------------------------

    def finish(self) -> int:
        """Record and drop every finished row; returns how many rows remain.

        A row is finished when no MASK is left, or (``generate``) when an EOS has been committed with
        every position before it resolved, or a stop string appears in the resolved generated text."""
        f = self.first_masked
        done = f >= self.canvas
        if self.cfg.mode == "generate":
            done = done | (self.eos_pos < f)
            if self.cfg.stop:
                self._search_stop_strings()
                done = done | (self.stop_end < self.canvas)
        if not bool(done.any()):
            return self.batch
        for b in torch.nonzero(done).flatten().tolist():
            self._record(b)
        self.select(torch.nonzero(~done).flatten())
        return self.batch

    def _search_stop_strings(self) -> None:
        """Search the newly resolved generated text of each row for the stop strings (Python, per row)."""
        tok = self.cfg.tokenizer
        if tok is None:
            raise ValueError("stop strings need the model's tokenizer")
        resolved = torch.minimum(self.first_masked, self.eos_pos)  # (B,) the text before any EOS
        grew = torch.nonzero((resolved > self.stop_checked) & (self.stop_end >= self.canvas)).flatten().tolist()
        for b in grew:
            start, end = int(self.gen_start[b]), int(resolved[b])
            ids = self.tokens[b, start:end].tolist()
            if stop_index(tok.decode(ids), self.cfg.stop) is not None:
                # the shortest token prefix whose text contains a stop string
                lo, hi = max(int(self.stop_checked[b]) - start, 0), len(ids)
                while lo < hi:
                    mid = (lo + hi) // 2
                    if stop_index(tok.decode(ids[:mid]), self.cfg.stop) is None:
                        lo = mid + 1
                    else:
                        hi = mid
                self.stop_end[b] = start + lo
        self.stop_checked = torch.maximum(self.stop_checked, resolved)

    def _record(self, b: int) -> None:
        f, N = int(self.first_masked[b]), self.canvas
        eos, stop, length = int(self.eos_pos[b]), int(self.stop_end[b]), int(self.length[b])
        if self.cfg.mode == "fill":
            reason, end = "done", length
        elif stop < N:  # found in the text before the EOS, so it ends first
            reason, end = "stop", stop
        elif eos < f:
            reason, end = "eos", eos + 1
        else:
            reason, end = "length", length
            rc = self.constraints[b] if self.constraints is not None else None
            if rc is not None and not rc.complete(self.tokens[b, rc.start:rc.end].tolist(),
                                                  self.masked[b, rc.start:rc.end].tolist()):
                # every committed prefix keeps a closing that fits (docs/decoding.md "Two engines"): never reached
                raise RuntimeError(f"row {int(self.index[b])} reached max_new_tokens before its constraint's document "
                                   f"closed: a broken invariant of {rc.engine}'s rows, not a finish reason")
        row = self.tokens[b, :length].tolist()
        tgt = self.target[b, :length].tolist()
        tokens = [t for i, (t, g) in enumerate(zip(row, tgt)) if g and i < end]
        sequence = row if self.cfg.mode == "fill" else row[:end]
        committed = sum(g for g, m in zip(tgt, self.masked[b, :length].tolist()) if not m)
        # rows decode together from the first step until they finish, so a row's NFE is the step count
        self.results[int(self.index[b])] = RowResult(tokens, sequence, reason, self.forwards, committed,
                                                     self.traces[b] if self.traces is not None else None)


def stop_index(text: str, stops: tuple[str, ...]) -> int | None:
    """Index of the earliest occurrence of any stop string in ``text`` (None if none occurs)."""
    hits = [i for i in (text.find(s) for s in stops) if i >= 0]
    return min(hits) if hits else None


# ---------------------------------------------------------------------------------------------------------
# forwards
# ---------------------------------------------------------------------------------------------------------


def evict_overflow(cache, n_new: Tensor, limit: int) -> None:
    """docs/method.md §4.5: where a row's cache plus its ``n_new`` (B,) new tokens would exceed ``limit`` (= L),
    evict the cache entries with the smallest positions (the position ledger's rule), keeping the rest in
    insertion order. Queries keep seeing every remaining entry."""
    over = cache.lengths + n_new - limit  # (B,)
    if not bool((over > 0).any()):
        return
    over = over.clamp(min=0)
    valid = torch.arange(cache.width, device=over.device) < cache.lengths[:, None]  # (B, W)
    pos = cache.positions().masked_fill(~valid, torch.iinfo(torch.long).max)  # (B, W)
    rank = pos.argsort(dim=-1, stable=True).argsort(dim=-1)  # (B, W) rank of each entry by position
    keep = valid & (rank >= over[:, None])
    index = (~keep).long().argsort(dim=-1, stable=True)  # kept entries first, in insertion order
    cache.keep_entries(index, keep.sum(-1))


def forward(backbone, st: DecodeState, slot_pos: Tensor, new_mask: Tensor, *, keep: Tensor | int | None,
            logits_start: int, n_new: Tensor) -> Tensor:
    """One backbone call on the canvas positions ``slot_pos`` (B, T) (trash column = padding) with the mask
    among the new tokens ``new_mask`` (B, T, T). With a cache: overflow is evicted first, and each row
    keeps its first ``keep`` new tokens. Returns logits (B, T − logits_start, V)."""
    ids = st.tokens.gather(1, slot_pos)  # (B, T)
    if st.cache is None:
        return backbone(ids, slot_pos, new_mask[:, None], None, logits_start=logits_start)
    if st.may_overflow:
        evict_overflow(st.cache, n_new, st.cfg.context_length)
    mask = with_cache(new_mask, st.cache.width)
    return backbone(ids, slot_pos, mask, st.cache, keep=keep, logits_start=logits_start)


def prefill(backbone, st: DecodeState, take: Tensor, block_size: int | None = None) -> None:
    """Cache the canvas positions ``take`` (B, N+1) of each row in ascending order, with the clean-stream
    mask: causal (``block_size`` None) or block-causal (BD3LM). Not counted as an NFE."""
    counts = take.sum(-1)  # (B,)
    T = int(counts.max())
    if T == 0:
        return
    key = torch.where(take, st.pos, st.pos + st.canvas + 1)  # (B, N+1): taken positions first, ascending
    slot_pos = key.topk(T, dim=-1, largest=False, sorted=True).indices  # (B, T)
    valid = torch.arange(T, device=st.device) < counts[:, None]  # (B, T)
    slot_pos = torch.where(valid, slot_pos, st.canvas)
    new = decode_block_mask(slot_pos if block_size is None else slot_pos // block_size, valid)  # (B, T, T)
    forward(backbone, st, slot_pos, new, keep=counts, logits_start=T, n_new=counts)
