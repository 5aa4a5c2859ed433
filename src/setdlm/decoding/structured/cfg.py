"""The CFG engine of left-to-right decodes: llguidance's matcher for the JSON Schemas setdlm's own token
automaton refuses (docs/decoding.md "Two engines").

setdlm's own engine (:mod:`setdlm.decoding.structured.constraint`, :mod:`setdlm.decoding.structured.enforce`)
writes a schema as a regular language and compiles it to a token automaton, whose reachability tells which
tokens keep a canvas with holes anywhere completable: what a set decode, committing several positions at once
and out of order, needs. Some schemas are not regular languages, or not small ones (``multipleOf`` without
bounds, a pattern with lengths, recursion whose unrolled regex passes the size bound, an automaton past the
compile bounds); those it refuses. A decode that commits left to
right (AR, SetDLM ``window=1``, ``speculate=True`` or ``"next_token"``, ``block_size=1``) only ever asks one
question: which tokens may follow the committed prefix. A context-free engine answers it. With the optional
``llguidance`` package (``pip install 'setdlm[constrain]'``; imported only when used) such decodes take the
schemas it compiles (its ``validate_grammar`` clean), and a set decode of one is refused in one line naming
setdlm's own reason. Without llguidance everything is as it was.

:class:`GrammarRow` is one row's matcher behind the interface the decoders call on a
:class:`~setdlm.decoding.structured.enforce.RowConstraint` (``allowed``, ``allowed_now``, ``completable``): it
consumes each token the decode commits, in order (EOS ends the output; the positions after it are padding),
and a speculative decode's drafts are consumed tentatively and rolled back. The allowed set keeps a prefix
of a valid document; the matcher alone does not know whether the document can still close within
``max_new_tokens``, as the automaton's reachability does. So each row keeps an invariant: its committed prefix
has a known *closing* (a token sequence to an accepting end, checked on a copy of the matcher) of at most the
positions left. A request whose empty output has none is refused before decoding; after that, each token a
decode chooses is vetted when it is committed (:meth:`GrammarRow.vet`, called by ``DecodeState.commit`` and by
the speculative decodes' ``verify`` along their verified run): after the closing's own next token the rest of
the closing fits; after any other token the greedy closing from there is searched within the positions left
after it, and where none is found the row commits the closing's next token instead (deterministic, sampled or
not; a speculative run is cut there, as at a rejected draft). So every accepted request ends on a whole
document within ``max_new_tokens``: EOS at an accepting point, or the last position accepting. Once the
positions left come within :data:`RESERVE` tokens of the closing's length, the mask itself allows only the
closing's next token (docs/decoding.md "Two engines"). The closings are defined token by token from the
committed prefix (:meth:`GrammarRow.closing_after`), so a speculative decode, which vets the same tokens,
still gives the left-to-right output.
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from dataclasses import dataclass

import torch
from torch import Tensor

from ...errors import UserError

ENGINE = "llguidance"
RESERVE = 8  # tokens: a row writes its closing once the positions left are at most its length plus this
CLOSERS = (b"}", b"]", b'"', b"0")  # the closing's preferred tokens, first allowed first (then the longest)
QUOTE_FIRST = (b'"', b"}", b"]", b"0")  # the second try's order: a string that allows '}' and ']' closes first
LEFT_TO_RIGHT = "only left-to-right decodes (AR, window=1, speculate, block_size=1) can use the CFG engine"


def llguidance():
    """The ``llguidance`` module, or None when it is not installed."""
    try:
        import llguidance as ll
    except ImportError:
        return None
    return ll


def schema_grammar(schema_text: str, whitespace: str | None = None) -> tuple[str | None, str]:
    """llguidance's grammar of a JSON Schema (JSON text) with setdlm's separators (``whitespace``: the regex
    between tokens, default an optional space), and ``""``; or None and why not (llguidance missing, or
    its own refusal, first line)."""
    ll = llguidance()
    if ll is None:
        return None, "llguidance is not installed"
    options = {"whitespace_pattern": "[ ]?" if whitespace is None else whitespace}
    try:
        grammar = ll.LLMatcher.grammar_from_json_schema(schema_text, defaults=options)
    except ValueError as e:
        return None, str(e).splitlines()[0] if str(e) else "invalid schema"
    error = ll.LLMatcher.validate_grammar(grammar)
    if error:
        return None, error.strip().splitlines()[0]
    return grammar, ""


@dataclass(frozen=True)
class TokenInfo:
    """A vocabulary as a row's mask and closing read it: ``text`` (n,) the tokens with bytes, ``length`` (n,)
    their bytes' lengths (0 for whitespace alone, which a closing takes last), ``closers`` the ids of
    :data:`CLOSERS` (those the vocabulary has), in that order, and ``quote_first`` those of :data:`QUOTE_FIRST`."""

    text: Tensor
    length: Tensor
    closers: tuple[int, ...]
    quote_first: tuple[int, ...]

    @staticmethod
    def of(pieces: list[bytes | None]) -> TokenInfo:
        first: dict[bytes, int] = {}
        for i, p in enumerate(pieces):
            if p in CLOSERS:
                first.setdefault(p, i)
        return TokenInfo(torch.tensor([p is not None for p in pieces], dtype=torch.bool),
                         torch.tensor([len(p) if p and p.strip() else 0 for p in pieces], dtype=torch.long),
                         tuple(first[c] for c in CLOSERS if c in first),
                         tuple(first[c] for c in QUOTE_FIRST if c in first))


class Matchers:
    """llguidance's tokenizers (per tokenizer and EOS) and a fresh matcher per grammar to copy (the 64 last
    used), held by a :class:`~setdlm.decoding.structured.constraint.ConstraintCompiler`."""

    def __init__(self, keep: int = 64):
        self.keep = keep
        self._tokenizers: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # tokenizer -> {eos: LLTokenizer}
        self._fresh: OrderedDict = OrderedDict()  # (grammar, vocabulary digest, eos) -> a fresh matcher
        self._tokens: OrderedDict = OrderedDict()  # vocabulary digest -> TokenInfo (the 4 last used)
        self._lock = threading.Lock()

    def token_info(self, pieces: list[bytes | None], digest: str) -> TokenInfo:
        """What a row's mask and closing read of the tokens ``pieces`` (their ``digest``), kept per vocabulary."""
        with self._lock:
            if digest not in self._tokens:
                self._tokens[digest] = TokenInfo.of(pieces)
                while len(self._tokens) > 4:
                    self._tokens.popitem(last=False)
            self._tokens.move_to_end(digest)
            return self._tokens[digest]

    def matcher(self, grammar: str, tokenizer, pieces: list[bytes | None], digest: str, eos: int):
        """A fresh matcher of ``grammar`` over ``tokenizer``'s tokens (``pieces``, their ``digest``): a copy of
        the one kept."""
        key = (grammar, digest, eos)
        with self._lock:
            if key not in self._fresh:
                self._fresh[key] = llguidance().LLMatcher(self._lltokenizer(tokenizer, pieces, eos), grammar,
                                                          log_level=0)
                while len(self._fresh) > self.keep:
                    self._fresh.popitem(last=False)
            self._fresh.move_to_end(key)
            return self._fresh[key].deep_copy()

    def _lltokenizer(self, tokenizer, pieces: list[bytes | None], eos: int):
        """llguidance's tokenizer over the same token bytes the automaton reads (special tokens: empty and
        special), kept per tokenizer."""
        ll = llguidance()
        try:
            per = self._tokenizers.setdefault(tokenizer, {})
        except TypeError:  # not weak-referenceable
            per = {}
        if eos not in per:
            backend = tokenizer.backend

            class _Tokens:
                eos_token_id, bos_token_id = eos, None
                tokens = [p if p is not None else b"" for p in pieces]
                special_token_ids = [i for i, p in enumerate(pieces) if p is None]

                def __call__(self, text):
                    text = text.decode("utf-8", "replace") if isinstance(text, bytes) else text
                    return backend.encode(text, add_special_tokens=False).ids

            per[eos] = ll.LLTokenizer(ll.TokenizerWrapper(_Tokens()), n_vocab=len(pieces))
        return per[eos]


class GrammarRow:
    """One row's llguidance matcher on its canvas region ``[start, end)`` (generate only: EOS, one of
    ``eos_ids``, ends the output at an accepting point). ``engine``: ``"llguidance"``."""

    engine = ENGINE

    def __init__(self, constraint, tokenizer, pieces: list[bytes | None], digest: str, start: int, end: int,
                 eos_ids: tuple[int, ...], matchers: Matchers):
        self.constraint, self.start, self.end, self.eos = constraint, start, end, tuple(eos_ids)
        self.info = matchers.token_info(pieces, digest)
        self.text = self.info.text  # (n,) tokens with bytes
        # llguidance's own EOS: a special token (its bit is dropped: EOS is ``eos_ids``, allowed where it accepts)
        eos = min(i for i, p in enumerate(pieces) if p is None) if self.text.numel() > int(self.text.sum()) else 0
        self.m = matchers.matcher(constraint.grammar, tokenizer, pieces, digest, eos)
        if self.m.is_error():
            why = (self.m.get_error() or "?").splitlines()[0]
            raise UserError(f"{constraint!r}: the CFG engine ({ENGINE}) failed: {why}", fields=(constraint.kind,))
        self.p = start  # first hole of the region: the tokens before it are consumed
        self.done = False  # an EOS was committed: the rest is padding
        # the closings known (:meth:`closing_after`): after the committed prefix and a run of tokens (the key),
        # a closing of at most the positions left there, or None (none fits); () is the committed prefix's
        self.ahead: dict[tuple[int, ...], list[int] | None] = {}

    def __copy__(self) -> GrammarRow:
        new = object.__new__(GrammarRow)
        new.__dict__.update(self.__dict__)
        new.m = self.m.deep_copy()
        new.ahead = dict(self.ahead)
        return new

    def _fail(self, what: str) -> RuntimeError:
        return RuntimeError(f"{ENGINE} {what}: {(self.m.get_error() or 'no error reported').splitlines()[0]}")

    def _fold_prefix(self, tokens: list[int], holes: list[bool]) -> None:
        """Consume the committed tokens after ``p`` (they never change again); the closing goes on where the
        token is its first."""
        while self.p < self.end and not holes[self.p - self.start]:
            t = tokens[self.p - self.start]
            if not self.done and t in self.eos:
                self.done = True
            elif not self.done:
                self.closing_after([t])  # the closing after t, by its rule, before the matcher moves
                if not self.m.consume_token(t):
                    raise self._fail(f"rejected the committed token {t}")
            self.ahead = {k[1:]: c for k, c in self.ahead.items() if k and k[0] == t}
            self.p += 1

    def closing_after(self, run: list[int]) -> list[int] | None:
        """The closing after the committed prefix and ``run`` (tokens that follow it, no EOS among them), of at
        most the positions left after them, or None where none fits. It is defined token by token, so that every
        decode that reaches a prefix, left to right or speculative, knows the same one: the committed prefix's is
        the greedy closing (:meth:`_closing`); after a token that is the first of the closing before it, the rest
        of that closing; after any other token, the greedy closing from there. Kept in :attr:`ahead`."""
        key: tuple[int, ...] = ()
        if key not in self.ahead:
            self.ahead[key] = self._closing(self.end - self.p, [])
        close = self.ahead[key]
        for t in run:
            prev, key = close, key + (t,)
            if key not in self.ahead:
                self.ahead[key] = prev[1:] if prev and prev[0] == t else self._closing(
                    self.end - self.p - len(key), list(key))
            close = self.ahead[key]
        return close

    def vet(self, run: list[int], t: int) -> int:
        """The token to commit where a decode chose ``t`` after the committed prefix and ``run`` (the tokens it
        commits before ``t`` in the same step): ``t`` when a closing of at most the positions left after it is
        known (:meth:`closing_after`), else the first token of the closing before it (EOS where that is empty),
        which keeps one by construction. So every committed prefix keeps a closing that fits in the positions
        left, and the region ends on a whole document (docs/decoding.md "Two engines")."""
        if self.done or t in self.eos or any(x in self.eos for x in run) or self.p + len(run) >= self.end:
            return t
        close = self.closing_after(run)
        if close is None or self.closing_after(run + [t]) is not None:
            return t  # None: a tentative prefix past the invariant, which no decode commits
        return close[0] if close else self.eos[0]

    def _closing(self, limit: int, run: list[int]) -> list[int] | None:
        """Tokens that take the matcher from its state after ``run`` to an accepting one, at most ``limit`` of
        them, or None when none is found (``run`` rejected included): greedy, each step taking the token the
        matcher forces, else the first of :data:`CLOSERS` it allows, else the longest token it allows (whitespace
        last), never an EOS id (one ends the output); where that finds none, the same with :data:`QUOTE_FIRST`'s
        order (inside a string that allows ``}``, the first order writes ``}`` until the limit). Checked on a
        copy of the matcher, so what it returns is a completion (an upper bound on the shortest one)."""
        if limit < 0:
            return None
        m = self.m.deep_copy()
        if run and (m.validate_tokens(run) < len(run) or not m.consume_tokens(run)):
            return None
        first = self._greedy(m.deep_copy(), limit, self.info.closers)
        return first if first is not None else self._greedy(m, limit, self.info.quote_first)

    def _greedy(self, m, limit: int, closers: tuple[int, ...]) -> list[int] | None:
        """:meth:`_closing`'s search from matcher ``m`` (consumed) with the preferred tokens ``closers``."""
        out = list[int]()
        while not m.is_accepting():
            if len(out) >= limit or m.is_error():
                return None
            forced = m.compute_ff_tokens()
            if forced and forced[0] < self.text.numel() and int(self.info.length[forced[0]]) \
                    and forced[0] not in self.eos:
                t = forced[0]
            else:
                bits = self._bits(m)
                bits[[e for e in self.eos if e < bits.numel()]] = False
                t = next((c for c in closers if bits[c]), -1)
                if t < 0:
                    if not bool(bits.any()):
                        return None
                    t = int(torch.argmax(torch.where(bits, self.info.length, -1)))  # the first longest
            if not m.consume_token(t):
                return None
            out.append(t)
        return out

    def completable(self, tokens: list[int], holes: list[bool]) -> bool:
        """Is a closing known from the committed prefix (folded) within the region? A canvas with committed
        tokens past the first hole (not one a left-to-right decode makes) is only checked for the matcher's
        failure."""
        if self.m.is_error():
            return False
        if not all(holes[self.p - self.start:]):
            return True
        return self.closing_after([]) is not None

    def complete(self, tokens: list[int], holes: list[bool]) -> bool:
        """Is the region, all of it committed, a whole document: did an EOS end it, or does the matcher accept?"""
        self._fold_prefix(tokens, holes)
        return self.done or self.m.is_accepting()

    def allowed(self, tokens: list[int], holes: list[bool], queries: list[int], V: int) -> Tensor:
        """(Q, V) bool: at the first hole, the tokens the matcher allows after the committed prefix (EOS where it
        accepts), or the closing's next token once the positions left come within :data:`RESERVE` of its
        length; a left-to-right decode asks nothing else (any other query inside the region is an error)."""
        self._fold_prefix(tokens, holes)
        if any(self.p < q < self.end for q in queries):
            raise RuntimeError(f"the CFG engine ({ENGINE}) serves left-to-right decodes only: a query past the "
                               f"first hole {self.p}")
        return self.allowed_now(tokens, holes, queries, V)

    def allowed_now(self, tokens: list[int], holes: list[bool], queries: list[int], V: int) -> Tensor:
        """:meth:`allowed` on a tentative canvas (a speculative decode's view: the committed prefix, folded,
        then drafts up to the first hole ``h``), without folding: the drafts are consumed and rolled back. The
        query at ``h`` gets the matcher's set; a query past ``h`` (a draft's guess, which verification alone
        commits) or one whose view holds a draft the grammar rejects (never committed) allows everything."""
        mask = torch.ones(len(queries), V, dtype=torch.bool)
        j = self.p - self.start
        run = []
        while j < len(holes) and not holes[j]:
            run.append(tokens[j])
            j += 1
        h = self.start + j
        if self.done or h >= self.end or h not in queries or any(t in self.eos for t in run):
            return mask
        if self.m.validate_tokens(run) < len(run):
            return mask
        row = self._row(run, V)
        for k, q in enumerate(queries):
            if q == h:
                mask[k] = row
        return mask

    def _row(self, run: list[int], V: int) -> Tensor:
        """(V,) bool after the committed prefix and ``run`` (drafts the grammar accepts): the closing's next token
        (EOS where it is empty) when the positions left are at most its length plus :data:`RESERVE`, else the
        matcher's set (:meth:`_mask`, with ``run`` consumed and rolled back)."""
        close = self.closing_after(run)
        if close is None or self.end - self.p - len(run) - len(close) > RESERVE:
            if run and not self.m.consume_tokens(run):
                raise self._fail("rejected a draft it had validated")
            try:
                return self._mask(V)
            finally:
                if run and not self.m.rollback(len(run)):
                    raise self._fail("could not roll back a draft")
        out = torch.zeros(V, dtype=torch.bool)
        if close:
            out[close[0]] = True
        else:
            out[torch.tensor([e for e in self.eos if e < V], dtype=torch.long)] = True
        return out

    def _bits(self, m) -> Tensor:
        """(n,) bool: the text tokens matcher ``m`` allows now."""
        raw = torch.frombuffer(bytearray(m.compute_bitmask()), dtype=torch.uint8)
        bits = ((raw[:, None] >> torch.arange(8, dtype=torch.uint8)) & 1).flatten().bool()  # little-endian bits
        n = self.text.numel()
        return bits[:n] & self.text

    def _mask(self, V: int) -> Tensor:
        """(V,) bool: the matcher's tokens now, text tokens only, and EOS iff it accepts."""
        bits = self._bits(self.m)
        n = min(V, self.text.numel())
        out = torch.zeros(V, dtype=torch.bool)
        out[:n] = bits[:n]
        eos = torch.tensor([e for e in self.eos if e < V], dtype=torch.long)
        out[eos] = self.m.is_accepting()
        if not bool(out.any()):
            if self.m.is_error():
                raise self._fail("failed")
            raise UserError(f"{self.constraint!r} cannot be spelled with this tokenizer's tokens: the CFG engine "
                            f"({ENGINE}) allows no token of it at position {self.p - self.start} of the output",
                            fields=(self.constraint.kind,))
        return out


def left_to_right(spec, cfg) -> bool:
    """Does a decode of the family ``spec`` (its registry entry) with config ``cfg`` commit one position at a
    time, left to right (so that the CFG engine can serve it)?"""
    if cfg.speculate or spec.left_to_right:
        return True
    if "window" in spec.decode_settings:  # SetDLM: a window of one position
        return cfg.window == 1
    return "block_size" in spec.decode_settings and cfg.block_size == 1  # BD3LM, MDLM: blocks of one position
