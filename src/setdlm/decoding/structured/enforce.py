"""Constrained decoding at set granularity: which tokens keep a canvas with holes completable
(docs/decoding.md "Constrained decoding").

A row's constrained *region* is a span ``[start, end)`` of its canvas (generate: the ``max_new_tokens``
generated positions; fill/infill: from the first to the last MASK, context between gaps included). Its
tokens must spell a word of the constraint's token automaton ``A`` (:mod:`setdlm.decoding.structured.constraint`),
extended for EOS: from an accepting state, EOS leads to a sink ``DONE`` that reads any token, so the
output may end early at an accepting state and the positions after its EOS are padding. Without EOS
(``ignore_eos``, fill, no EOS id) the region must be a word of exactly ``end − start`` tokens.

With the positions fixed, a canvas with holes is completable iff some path of ``A`` reads each committed
token at its position and any token at each hole and ends accepting. Let ``F_i`` be the states reachable
at position ``i`` from the start (forward) and ``B_i`` those from which an accepting end is reachable
reading positions ``i..end`` (backward). Committing token ``t`` at a hole ``i`` keeps the canvas
completable iff ``δ(q, t) ∈ B_{i+1}`` for some ``q ∈ F_i``: that is the allowed set of position ``i``,
applied to its logits before the commit rule. A step commits a *set*; each member is allowed alone, but
two may exclude each other (``ab|ba``: ``a`` at 0 and ``a`` at 1), so the set is accepted member by member
in decreasing confidence, each kept only if the canvas with the members kept so far stays completable;
the most confident is always kept (it is allowed), the others wait for a later step.

Cost per step and row: ``F`` from the first hole ``p`` (the committed prefix before it is folded once)
to the last committed position or query ``hi``; ``B_hi = R_{end − hi}``, where ``R_k`` (the states that
end accepting after ``k`` free tokens) is computed once per automaton; ``B`` back from ``hi``. Each
position costs the automaton's state pairs (a hole) or one token's edges (committed); each query's mask
costs the edges leaving ``F_i``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import torch
from torch import Tensor

from ...errors import UserError
from .cfg import ENGINE, LEFT_TO_RIGHT, GrammarRow, schema_grammar
from .constraint import DEFAULT_COMPILER, CompileBound, Constraint, ConstraintCompiler, TokenAutomaton


class RowConstraint:
    """One row's constraint on its canvas region ``[start, end)``, with EOS (``eos_ids``) ending the
    output early at an accepting state when ``eos_ids`` is non-empty. ``engine``: ``"setdlm"`` (its token
    automaton; :class:`~setdlm.decoding.structured.cfg.GrammarRow`'s is ``"llguidance"``)."""

    engine = "setdlm"

    def __init__(self, constraint: Constraint, auto: TokenAutomaton, start: int, end: int, eos_ids: tuple[int, ...]):
        self.constraint, self.a = constraint, auto
        self.start, self.end = start, end
        self.eos = tuple(eos_ids)
        self.K = auto.states  # index K = DONE
        self.done = self.K
        self.eos_t = torch.tensor(self.eos, dtype=torch.long)
        pair_src, pair_dst = auto.pair_src, auto.pair_dst
        extra_src, extra_dst = [], []
        if self.eos:  # accepting --EOS--> DONE --any--> DONE
            fin = torch.nonzero(auto.final).flatten()
            extra_src, extra_dst = fin.tolist() + [self.K], [self.K] * (fin.numel() + 1)
            text = ~torch.isin(auto.src_tok, self.eos_t)  # (E,) an EOS id that is also a text token ends
            if not bool(text.all()):  # the output: its text edges are not paths
                src = torch.repeat_interleave(torch.arange(self.K), auto.src_ptr.diff())  # (E,)
                pairs = torch.unique(src[text] * self.K + auto.src_dst[text])
                pair_src, pair_dst = pairs // self.K, pairs % self.K
        self.pair_src = torch.cat([pair_src, torch.tensor(extra_src, dtype=torch.long)])
        self.pair_dst = torch.cat([pair_dst, torch.tensor(extra_dst, dtype=torch.long)])
        self.p = start  # first hole of the region (positions before it are committed)
        self.Fp = self._unit(auto.initial)  # F at p

    # -- sets of states: (K+1,) bool ------------------------------------------------------------------------

    def _unit(self, q: int) -> Tensor:
        s = torch.zeros(self.K + 1, dtype=torch.bool)
        s[q] = True
        return s

    def _reach(self, k: int) -> Tensor:
        """R_k: states from which ``k`` more free tokens can end accepting (cached per automaton)."""
        table = self.a.reach.setdefault(self.eos, [])  # per EOS ids: they shape the pairs
        if not table:
            r0 = torch.cat([self.a.final, torch.tensor([bool(self.eos)])])  # (K+1,)
            table.append(r0)
        while len(table) <= k:
            table.append(self._pre_any(table[-1]))
        return table[k]

    def _step_any(self, F: Tensor) -> Tensor:
        out = torch.zeros_like(F)
        out[self.pair_dst[F[self.pair_src]]] = True
        return out

    def _pre_any(self, B: Tensor) -> Tensor:
        out = torch.zeros_like(B)
        out[self.pair_src[B[self.pair_dst]]] = True
        return out

    def _edges_of(self, t: int) -> tuple[Tensor, Tensor]:
        a = self.a
        if t >= a.vocab_size:
            return a.tok_src[:0], a.tok_dst[:0]
        lo, hi = int(a.tok_ptr[t]), int(a.tok_ptr[t + 1])
        return a.tok_src[lo:hi], a.tok_dst[lo:hi]

    def _step_tok(self, F: Tensor, t: int) -> Tensor:
        out = torch.zeros_like(F)
        if t in self.eos:
            out[self.done] = bool((F[: self.K] & self.a.final).any()) or bool(F[self.done])
            return out
        s, d = self._edges_of(t)
        out[d[F[s]]] = True
        out[self.done] = F[self.done]  # DONE reads anything (only reachable with EOS)
        return out

    def _pre_tok(self, B: Tensor, t: int) -> Tensor:
        out = torch.zeros_like(B)
        if t in self.eos:
            out[: self.K] = self.a.final & B[self.done]
            out[self.done] = B[self.done]
            return out
        s, d = self._edges_of(t)
        out[s[B[d]]] = True
        out[self.done] = B[self.done]
        return out

    # -- the canvas -------------------------------------------------------------------------------------

    def _fold_prefix(self, tokens: list[int], holes: list[bool]) -> None:
        """Advance ``p`` over the committed tokens after it (they never change again)."""
        while self.p < self.end and not holes[self.p - self.start]:
            self.Fp = self._step_tok(self.Fp, tokens[self.p - self.start])
            self.p += 1

    def _forward(self, tokens, holes, hi: int) -> list[Tensor]:
        """F_p .. F_hi (hi − p + 1 sets)."""
        F = [self.Fp]
        for i in range(self.p, hi):
            j = i - self.start
            F.append(self._step_any(F[-1]) if holes[j] else self._step_tok(F[-1], tokens[j]))
        return F

    def _last_committed(self, holes: list[bool]) -> int:
        """One past the last committed position of the region (``p`` when none follows ``p``)."""
        for j in range(len(holes) - 1, self.p - self.start - 1, -1):
            if not holes[j]:
                return self.start + j + 1
        return self.p

    def completable(self, tokens: list[int], holes: list[bool]) -> bool:
        """Can the region's holes be filled so that it matches? (``tokens``/``holes``: the region's, whose
        committed prefix up to ``p`` must be the one already folded; nothing is folded here, so a tentative
        canvas can be tested)"""
        hi = self._last_committed(holes)
        return bool((self._forward(tokens, holes, hi)[-1] & self._reach(self.end - hi)).any())

    def complete(self, tokens: list[int], holes: list[bool]) -> bool:
        """Is the region, all of it committed, a match? Always: every step kept the canvas completable."""
        return True

    def allowed(self, tokens: list[int], holes: list[bool], queries: list[int], V: int) -> Tensor:
        """(Q, V) bool: the tokens that keep the canvas completable at each query position (holes of the
        region; a query outside the region allows everything)."""
        self._fold_prefix(tokens, holes)
        return self.allowed_now(tokens, holes, queries, V)

    def allowed_now(self, tokens: list[int], holes: list[bool], queries: list[int], V: int) -> Tensor:
        """:meth:`allowed` without folding the committed prefix (so the canvas may be a tentative one, whose
        prefix up to ``p`` is the one already folded)."""
        mask = torch.ones(len(queries), V, dtype=torch.bool)
        inside = [q for q in queries if self.start <= q < self.end]
        if not inside:
            return mask
        hi = max(self._last_committed(holes), max(inside) + 1)
        F = self._forward(tokens, holes, hi)  # F[i − p]
        B = {hi: self._reach(self.end - hi)}
        for i in range(hi - 1, min(inside), -1):  # B_{q+1} for every query q
            j = i - self.start
            B[i] = self._pre_any(B[i + 1]) if holes[j] else self._pre_tok(B[i + 1], tokens[j])
        for k, q in enumerate(queries):
            if self.start <= q < self.end:
                mask[k] = self._tokens_between(F[q - self.p], B[q + 1], V)
        return mask

    def _tokens_between(self, F: Tensor, B: Tensor, V: int) -> Tensor:
        """(V,) bool: tokens t with δ(q, t) ∈ B for some q ∈ F."""
        if bool(F[self.done]) and bool(B[self.done]):
            return torch.ones(V, dtype=torch.bool)  # after EOS: padding, anything
        out = torch.zeros(V, dtype=torch.bool)
        a = self.a
        states = torch.nonzero(F[: self.K]).flatten()
        if states.numel():
            lo, n = a.src_ptr[states], a.src_ptr[states + 1] - a.src_ptr[states]  # (S,)
            total = int(n.sum())
            if total:
                base = torch.repeat_interleave(lo - (n.cumsum(0) - n), n)  # (E',) edge index − running offset
                idx = base + torch.arange(total)
                keep = B[a.src_dst[idx]]
                out[a.src_tok[idx][keep]] = True
            eos = self.eos_t[self.eos_t < V]
            out[eos] = False  # an EOS id that is also a text token (e.g. a newline) still ends the output
            if self.eos and bool(B[self.done]) and bool((F[: self.K] & a.final).any()):
                out[eos] = True
        return out


Rows = Sequence[RowConstraint | GrammarRow | None]  # a state's rows: each one's engine, None for a free row


def row_constraints(constraints, sequences: list[list[int]], targets: list[list[bool]], mode: str, tokenizer,
                    eos_ids: tuple[int, ...], left_to_right: bool = False,
                    compiler: ConstraintCompiler | None = None) -> list[RowConstraint | GrammarRow | None] | None:
    """One :class:`RowConstraint` per row (None where the row has no constraint; None for all when no row
    has one), each checked satisfiable before any decoding: a ``ValueError`` naming the row otherwise.
    Generate: the region is the generated positions and EOS (``eos_ids``) may end it early; fill: from
    the first to the last MASK, exactly that many tokens, the context between gaps included. A decode that
    commits ``left_to_right`` takes a :class:`~setdlm.decoding.structured.cfg.GrammarRow` (llguidance) for a JSON
    Schema only the CFG engine compiles, or whose automaton passes a compile bound (generate with EOS).
    ``compiler``: whose bounds, cache and processes compile them (default the library's, ``DEFAULT_COMPILER``)."""
    if constraints is None or all(c is None for c in constraints):
        return None
    out: list[RowConstraint | GrammarRow | None] = []
    for i, (c, seq, tgt) in enumerate(zip(constraints, sequences, targets)):
        if c is None or not any(tgt):
            out.append(None)
            continue
        lo, hi = tgt.index(True), len(tgt) - tgt[::-1].index(True)
        rc = _row(i, c, tokenizer, lo, hi, eos_ids if mode == "generate" else (), left_to_right,
                  compiler if compiler is not None else DEFAULT_COMPILER)
        if not rc.completable(seq[lo:hi], tgt[lo:hi]):
            if mode == "generate":
                raise UserError(f"row {i}: {c!r} has no match of at most {hi - lo} tokens (max_new_tokens) with this "
                                f"tokenizer{'' if rc.eos else ' and without EOS, exactly that many'}; raise "
                                f"max_new_tokens")
            raise UserError(f"row {i}: {c!r} cannot be matched by the {hi - lo} tokens from the first to the last "
                            f"MASK of the row (exactly that many, with its context between gaps)")
        out.append(rc)
    return out


def _row(i: int, c: Constraint, tokenizer, lo: int, hi: int, eos: tuple[int, ...], left_to_right: bool,
         compiler: ConstraintCompiler) -> RowConstraint | GrammarRow:
    """Row ``i``'s engine: setdlm's automaton; or, for a left-to-right decode that ends on EOS, llguidance's
    matcher where the automaton was refused (``c.pattern`` None) or passed a compile bound."""
    if c.pattern is not None:
        try:
            return RowConstraint(c, compiler.automaton(c, tokenizer, hi - lo), lo, hi, eos)
        except CompileBound as e:
            spec = c.spec if c.kind == "json_schema" and isinstance(c.spec, str) else None  # the schema's JSON text
            grammar = schema_grammar(spec, c.whitespace)[0] if spec is not None else None
            if grammar is None:
                raise
            c = replace(c, pattern=None, grammar=grammar, refusal=str(e))
    if not left_to_right:
        raise UserError(f"row {i}: {c.refusal}; {LEFT_TO_RIGHT} ({ENGINE}), which compiles it", fields=(c.kind,))
    if not eos:
        raise UserError(f"row {i}: {c.refusal}; the CFG engine ({ENGINE}), which compiles it, needs EOS to end the "
                        f"output (generate, without ignore_eos)", fields=(c.kind,))
    pieces, digest, _ = compiler.vocabulary(tokenizer)
    return GrammarRow(c, tokenizer, pieces, digest, lo, hi, eos, compiler.matchers)


def allowed_tokens(rows: Rows, tokens: Tensor, masked: Tensor, qpos: Tensor, qvalid: Tensor,
                   V: int) -> Tensor:
    """(B, Q, V) bool: the tokens each query of each row may take (everything for a row without a
    constraint). ``tokens``/``masked`` (B, N+1): the canvas; ``qpos``/``qvalid`` (B, Q): the queries."""
    allowed = torch.ones(*qpos.shape, V, dtype=torch.bool)  # (B, Q, V)
    for b, rc in enumerate(rows):
        if rc is None:
            continue
        qp = qpos[b].tolist()
        ks = [k for k, v in enumerate(qvalid[b].tolist()) if v]
        if not ks:
            continue
        toks, holes = tokens[b, rc.start:rc.end].tolist(), masked[b, rc.start:rc.end].tolist()
        allowed[b, ks] = rc.allowed(toks, holes, [qp[k] for k in ks], V)
    return allowed.to(qpos.device)


def keep_jointly(rows: Rows, tokens: Tensor, masked: Tensor, qpos: Tensor, tok: Tensor,
                 conf: Tensor, commit: Tensor) -> Tensor:
    """The commit set (B, Q) with every member dropped that, together with the more confident members
    kept before it, would leave the canvas uncompletable (the most confident one is always kept)."""
    counts = commit.sum(-1).tolist()
    for b, rc in enumerate(rows):
        if rc is None or counts[b] < 2:
            continue
        ks = torch.nonzero(commit[b]).flatten()
        order = ks[torch.argsort(-conf[b, ks].double(), stable=True)].tolist()
        toks, holes = tokens[b, rc.start:rc.end].tolist(), masked[b, rc.start:rc.end].tolist()
        for n, k in enumerate(order):
            j = int(qpos[b, k]) - rc.start
            if not 0 <= j < len(toks):
                continue
            old = toks[j]
            toks[j], holes[j] = int(tok[b, k]), False
            if n and not rc.completable(toks, holes):
                toks[j], holes[j] = old, True
                commit[b, k] = False
    return commit


def allowed_given_drafts(rows: Rows, tokens: Tensor, masked: Tensor, drafted: Tensor,
                         draft: Tensor, qpos: Tensor, qvalid: Tensor, horizon: Tensor, V: int) -> Tensor:
    """(B, Q, V) bool: the tokens each query of self-speculative decoding (``decoding/speculative.py``) may
    take. A query of horizon ``h`` sees the committed canvas and the drafts before ``h`` (``drafted``/``draft``
    (B, N+1)), not those from ``h`` on, as the left-to-right decode it reproduces sees its canvas once those
    drafts are committed: its allowed set is :meth:`RowConstraint.allowed` on that canvas. So a verifier
    masks exactly as the constrained ``window=1`` decode does at that point, and a draft by the same
    reachability. ``qpos``/``qvalid``/``horizon``: (B, Q)."""
    allowed = torch.ones(*qpos.shape, V, dtype=torch.bool)  # (B, Q, V)
    for b, rc in enumerate(rows):
        if rc is None:
            continue
        toks, holes = tokens[b, rc.start:rc.end].tolist(), masked[b, rc.start:rc.end].tolist()
        rc._fold_prefix(toks, holes)  # the committed prefix only: the drafts are tentative
        d_at, d_tok = drafted[b, rc.start:rc.end].tolist(), draft[b, rc.start:rc.end].tolist()
        by_horizon: dict[int, list[int]] = {}
        for k, (h, ok) in enumerate(zip(horizon[b].tolist(), qvalid[b].tolist())):
            if ok:
                by_horizon.setdefault(h, []).append(k)
        for h, ks in by_horizon.items():
            seen = [d_at[j] and rc.start + j < h for j in range(len(toks))]  # the drafts this horizon sees
            t_h = [d if s else t for t, d, s in zip(toks, d_tok, seen)]
            holes_h = [hole and not s for hole, s in zip(holes, seen)]
            allowed[b, ks] = rc.allowed_now(t_h, holes_h, qpos[b, ks].tolist(), V)
    return allowed.to(qpos.device)


def vet_commits(rows: Rows, qpos: Tensor, tok: Tensor, commit: Tensor) -> Tensor:
    """(B, Q) bool: where a left-to-right decode's commit (``DecodeState.commit``: one query per row, at its first
    hole) had its token ``tok`` replaced, in place, by a CFG row's :meth:`GrammarRow.vet
    <setdlm.decoding.structured.cfg.GrammarRow.vet>`: a token after which no closing fits in the positions left
    gives way to the closing's next token (docs/decoding.md "Two engines"). The automaton's rows are exact
    already: never touched."""
    replaced = torch.zeros_like(commit)
    for b, rc in enumerate(rows):
        if not isinstance(rc, GrammarRow):
            continue
        for k in torch.nonzero(commit[b]).flatten().tolist():
            q, t = int(qpos[b, k]), int(tok[b, k])
            if not rc.start <= q < rc.end:
                continue
            if q != rc.p:
                raise RuntimeError(f"the CFG engine ({ENGINE}) serves left-to-right decodes only: a commit at {q}, "
                                   f"past the first hole {rc.p}")
            new = rc.vet([], t)
            if new != t:
                tok[b, k], replaced[b, k] = new, True
    return replaced


def vet_verified(rows: Rows, v_ok: Tensor, v_tok: Tensor, is_draft: Tensor,
                 d_tok: Tensor, acc: Tensor) -> Tensor:
    """The accepted drafts (B,) of a speculative step (``decoding/speculative.py``'s ``verify``) once each CFG row
    has vetted its verifiers' tokens ``v_tok`` (B, K+1) in order, as the left-to-right decode would commit them
    (:func:`vet_commits`): a token replaced by its closing's next token is written in place, and the drafts are
    accepted while each equals the (vetted) verifier's token, so the run stops where the left-to-right decode's
    tokens leave the draft. ``acc``: the step's own count, kept for every other row."""
    acc = acc.clone()
    for b, rc in enumerate(rows):
        if not isinstance(rc, GrammarRow):
            continue
        ok, toks, drafts, known = v_ok[b].tolist(), v_tok[b].tolist(), d_tok[b].tolist(), is_draft[b].tolist()
        run: list[int] = []
        for i, t in enumerate(toks):
            if not ok[i]:
                break
            new = rc.vet(run, t)
            if new != t:
                v_tok[b, i] = new
            if not (known[i] and drafts[i] == new):
                break
            run.append(new)
        acc[b] = len(run)
    return acc
