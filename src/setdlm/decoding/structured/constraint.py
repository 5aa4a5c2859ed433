"""Output constraints: a regular expression, a JSON Schema or a list of choices, compiled to a token-level
automaton for a tokenizer (docs/decoding.md "Constrained decoding").

Three constructors build a :class:`Constraint`, which is only a description (the regular expression the
whole output must match):

* :func:`regex` — a regular expression (the syntax of Rust's ``regex`` crate, which outlines-core uses;
  for the common subset it is Python's ``re``);
* :func:`json_schema` — a JSON Schema (a dict or its JSON text), turned into the regular expression of
  JSON documents that validate against it (:mod:`setdlm.decoding.structured.schema.regex`); recursive references
  are unrolled to ``max_depth`` (default 3), free-form values (``{"type": "object"}``, ``{}``) nest arrays
  and objects 2 levels; :func:`json_object` is any JSON object, nested at most ``max_depth`` (default 2)
  levels;
* :func:`choice` — one of a list of strings, literally.

A :class:`ConstraintCompiler` compiles a constraint for a tokenizer (:func:`automaton`: the library's default
one): outlines-core (optional extra ``constrain``) builds the deterministic automaton over the tokenizer's tokens
(each token read as its bytes, :mod:`setdlm.decoding.structured.token_bytes`), which is turned into the tensors
the canvas reachability of :mod:`setdlm.decoding.structured.enforce` needs. It runs in a separate process
(:mod:`setdlm.decoding.structured.worker`) under the compiler's :class:`Bounds` (time, memory, size), with the
counted repetitions cut to what ``max_tokens`` tokens can hold (docs/decoding.md "Bounds"). Results are cached
per (pattern, tokenizer vocabulary) in the compiler, the cache bounded by bytes. Only tokenizers whose text is
the concatenation of their tokens' bytes are supported: byte-level BPE and character tokenizers (every
tokenizer of this library, SmolLM2's); another decoder (e.g. SentencePiece's ``▁``) is a ``ValueError``.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import threading
import weakref
from collections import OrderedDict
from dataclasses import dataclass, field, fields, replace

import torch
from torch import Tensor

from ...errors import UserError
from .cfg import ENGINE, LEFT_TO_RIGHT, Matchers, llguidance, schema_grammar
from .compiler import Compiler, cut_repetitions, without_end_mark
from .schema.regex import check_nesting, schema_regex
from .schema.strings import strip_anchors
from .token_bytes import vocabulary

DEFAULT_MAX_DEPTH = 3  # JSON Schema: depth to which recursive references are unrolled
REFUSALS_KEPT = 256  # a ConstraintCompiler keeps its last refusals, so a schema past a bound fails fast again
_META = set("\\.+*?()|[]{}^$#&-~")  # characters a literal escapes (Rust regex syntax)


@dataclass(frozen=True)
class Constraint:
    """What the output must be: ``pattern``, a regular expression the whole output must match.
    ``kind`` is ``"regex"``, ``"json_schema"`` or ``"choice"``; ``spec`` what it was built from (the
    regex, the schema as canonical JSON text, or the tuple of choices). A JSON Schema that only the CFG engine
    compiles has no ``pattern``, its llguidance ``grammar`` and setdlm's ``refusal`` instead."""

    kind: str
    pattern: str | None
    spec: str | tuple[str, ...] = field(compare=False)
    grammar: str | None = None  # llguidance's grammar, when only the CFG engine compiles it (pattern None)
    refusal: str | None = field(default=None, compare=False)  # then, why setdlm's own automaton refused it
    whitespace: str | None = field(default=None, compare=False)  # json_schema's, for the CFG engine

    @property
    def engine(self) -> str:
        """Which engine enforces it: ``"setdlm"`` (the token automaton, every decode) or ``"llguidance"``
        (the CFG engine, left-to-right decodes only: :mod:`setdlm.decoding.structured.cfg`)."""
        return "setdlm" if self.pattern is not None else "llguidance"

    def __repr__(self) -> str:
        shown = self.spec[:60] + "…" if isinstance(self.spec, str) and len(self.spec) > 60 else self.spec
        return f"{self.kind}({shown!r})"


def regex(pattern: str) -> Constraint:
    """The output must match ``pattern`` in full (so a leading ``^`` and a trailing ``$`` are dropped: the
    whole output is matched anyway)."""
    if not isinstance(pattern, str) or not pattern:
        raise UserError(f"regex must be a non-empty string, got {pattern!r}", fields=("regex",))
    body = strip_anchors(pattern)
    if not body:
        raise UserError(f"regex {pattern!r} matches only the empty output", fields=("regex",))
    return Constraint("regex", body, pattern)


def choice(options) -> Constraint:
    """The output must be exactly one of ``options`` (non-empty strings)."""
    if isinstance(options, str) or not isinstance(options, (list, tuple)) or not options:
        raise UserError(f"choice needs a non-empty list of strings, got {options!r}")
    if not all(isinstance(o, str) and o for o in options):
        raise UserError(f"every choice must be a non-empty string, got {list(options)!r}")
    options = tuple(dict.fromkeys(options))
    return Constraint("choice", "(" + "|".join(_escape(o) for o in options) + ")", options)


def json_schema(schema, *, max_depth: int = DEFAULT_MAX_DEPTH, whitespace: str | None = None,
                cfg: bool | None = None) -> Constraint:
    """The output must be a JSON document that validates against ``schema`` (a dict, or its JSON text).
    ``max_depth``: how many times recursive references are re-entered along a path (free-form values such
    as ``{"type": "object"}`` nest 2 levels); ``whitespace``: the regex of the whitespace allowed between
    tokens of the JSON text (default an optional space). A schema that is not valid JSON, not a valid JSON
    Schema, or asks what the token automaton cannot enforce is a ``ValueError`` naming the keyword and path;
    except, with ``cfg`` None (default) and llguidance installed, one that llguidance compiles: then the
    constraint serves left-to-right decodes only (``engine`` ``"llguidance"``, :mod:`setdlm.decoding.structured.cfg`).
    ``cfg=False``: setdlm's automaton or the error."""
    _outlines()  # outlines-core is needed: one clear line when it is missing
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except json.JSONDecodeError as e:
            raise UserError(f"json_schema: the schema is not valid JSON: {e}") from None
    if not isinstance(schema, dict):
        raise UserError(f"json_schema: a schema is a JSON object, got {type(schema).__name__}")
    if not (isinstance(max_depth, int) and not isinstance(max_depth, bool) and max_depth >= 0):
        raise UserError(f"max_depth must be an integer >= 0, got {max_depth!r}")
    check_nesting(schema)
    _check_schema(schema)
    text = json.dumps(schema)  # property order kept: outlines-core writes properties in this order
    try:
        pattern = schema_regex(schema, max_depth=max_depth, whitespace=whitespace)
    except UserError as e:
        if cfg is False:
            raise
        grammar, why = schema_grammar(text, whitespace)
        if grammar is None:
            if llguidance() is None:
                raise
            raise UserError(f"{e}; the CFG engine ({ENGINE}) refuses it too: {why}", fields=e.fields) from None
        return Constraint("json_schema", None, text, grammar=grammar, refusal=str(e), whitespace=whitespace)
    return Constraint("json_schema", pattern, text, whitespace=whitespace)


def json_object(*, max_depth: int = 2) -> Constraint:
    """Any JSON object (OpenAI's ``{"type": "json_object"}``) whose values nest objects and arrays at most
    ``max_depth`` levels deep (1: scalar values only). The automaton grows steeply with the depth
    (outlines-core compiles depth 2 in about half a second, depth 3 in about half a minute)."""
    if not (isinstance(max_depth, int) and not isinstance(max_depth, bool) and max_depth >= 1):
        raise UserError(f"max_depth must be an integer >= 1, got {max_depth!r}")
    scalar = [{"type": "string"}, {"type": "number"}, {"type": "boolean"}, {"type": "null"}]

    def value(d: int) -> dict:
        if d == 0:
            return {"anyOf": scalar}
        return {"anyOf": scalar + [{"type": "array", "items": value(d - 1)},
                                   {"type": "object", "additionalProperties": value(d - 1)}]}

    return json_schema({"type": "object", "additionalProperties": value(max_depth - 1)})


def as_constraint(value) -> Constraint | None:
    """What ``constraint=`` takes, as a :class:`Constraint`: one as it is (or None); a dict, a JSON Schema
    (:func:`json_schema`); a Pydantic model class, its ``model_json_schema()``; a list or tuple of strings, the
    choices (:func:`choice`). Anything else is a ``TypeError`` naming what is accepted."""
    if value is None or isinstance(value, Constraint):
        return value
    if isinstance(value, dict):
        return json_schema(value)
    schema_of = getattr(value, "model_json_schema", None)
    if isinstance(value, type) and callable(schema_of):  # Pydantic v2 model
        return json_schema(schema_of())
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, str) for v in value):
        return choice(list(value))
    raise TypeError("constraint must be made by setdlm.decoding.structured.constraint.regex/json_schema/choice, or be "
                    "a JSON Schema (dict), a Pydantic model class or a list of choices (strings); or a list of those, "
                    f"one per row, None for a free row; got {value!r}")


def _escape(text: str) -> str:
    return "".join("\\" + c if c in _META else c for c in text)


def _check_schema(schema: dict) -> None:
    """Check the schema against the JSON Schema meta-schema when ``jsonschema`` is installed."""
    try:
        import jsonschema
    except ImportError:  # outlines-core's own checks still apply
        return
    cls = jsonschema.validators.validator_for(schema)
    try:
        cls.check_schema(schema)
    except jsonschema.SchemaError as e:
        where = "/".join(str(p) for p in e.absolute_path) or "(root)"
        raise UserError(f"json_schema: invalid schema at {where}: {e.message}") from None


def _outlines():
    try:
        import outlines_core
    except ImportError:
        raise ImportError("constrained decoding needs outlines-core: pip install 'setdlm[constrain]'") from None
    return outlines_core


# ---------------------------------------------------------------------------------------------------------
# the token-level automaton
# ---------------------------------------------------------------------------------------------------------


@dataclass
class TokenAutomaton:
    """A deterministic automaton over token ids: states ``0..K-1``, start ``initial``, accepting
    ``final`` (K,) bool, and its transitions ``δ(s, t) = d`` as edge lists (int64), sorted twice:

    * by source state: ``src_ptr`` (K+1,), ``src_tok``, ``src_dst`` (E,) — the tokens leaving a state;
    * by token: ``tok_ptr`` (V+1,), ``tok_src``, ``tok_dst`` (E,) — where one token leads;

    and ``pair_src``, ``pair_dst`` (P,): the distinct state pairs joined by some token. EOS is not among the
    tokens; :mod:`setdlm.decoding.structured.enforce` adds it (from accepting states) itself."""

    initial: int
    final: Tensor
    src_ptr: Tensor
    src_tok: Tensor
    src_dst: Tensor
    tok_ptr: Tensor
    tok_src: Tensor
    tok_dst: Tensor
    pair_src: Tensor
    pair_dst: Tensor
    vocab_size: int
    reach: dict = field(default_factory=dict)  # EOS ids -> list of R_k tensors (enforce.py), grown lazily

    @property
    def nbytes(self) -> int:
        """Bytes of its tensors (the reachability tables grown so far left out)."""
        return sum(t.numel() * t.element_size() for t in (self.final, self.src_ptr, self.src_tok, self.src_dst,
                                                          self.tok_ptr, self.tok_src, self.tok_dst, self.pair_src,
                                                          self.pair_dst))

    @property
    def states(self) -> int:
        return self.final.shape[0]


class CompileBound(UserError):
    """Compiling a constraint's automaton passed a bound (time, memory, size; for a JSON Schema, a regex
    outlines-core cannot build): a left-to-right decode may then use the CFG engine."""


class _Refused(Exception):
    """A compile's refusal ``error`` and the ``bound`` under which a later call may take it from the cache of
    refusals (``"seconds"``, ``"memory"``, ``"edges"``, ``"always"``; None: not kept)."""

    def __init__(self, error: UserError, bound: str | None):
        super().__init__(str(error))
        self.error, self.bound = error, bound


@dataclass(frozen=True)
class Bounds:
    """What compiling one constraint may take (docs/decoding.md "Bounds"): ``seconds`` of wall time (waiting
    for a free compiler included), ``memory`` bytes of address space of the compiling process, ``edges``
    token transitions of the automaton; ``cache_bytes``: the automata kept, all together; ``workers``:
    compiling processes at once (the rest wait, within their ``seconds``). A constraint past a bound is a
    :class:`UserError`, and the caller's process is never at risk: compilation runs in a separate process."""

    seconds: float = 30.0
    memory: int = 4 << 30
    edges: int = 20_000_000
    cache_bytes: int = 1 << 30
    workers: int = 2

    def __post_init__(self):
        for f in fields(self):
            v = getattr(self, f.name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or v <= 0:
                raise UserError(f"{f.name} must be a positive number, got {v!r}")


_SECONDS: contextvars.ContextVar[float | None] = contextvars.ContextVar("constraint_seconds", default=None)


@contextlib.contextmanager
def time_limit(seconds: float):
    """Within the block, a compilation in this thread (or task) takes at most ``seconds`` (and never more
    than its compiler's ``bounds.seconds``): the server gives each request what its ``timeout`` leaves."""
    token = _SECONDS.set(seconds)
    try:
        yield
    finally:
        _SECONDS.reset(token)


class ConstraintCompiler:
    """Compiles constraints to token automata for tokenizers (docs/decoding.md "Bounds"), and owns what that
    needs: its :class:`Bounds`, its cache of automata per (pattern, vocabulary) bounded by bytes, its compiling
    processes, the tokenizers' bytes and the CFG engine's matchers (:class:`setdlm.decoding.structured.cfg.Matchers`).
    Whoever decodes holds one (a :class:`~setdlm.decoding.session.Session`, the server's app), so two in one
    process can differ; the library's calls (``generate``, :func:`automaton`) use :data:`DEFAULT_COMPILER`."""

    def __init__(self, bounds: Bounds | None = None):
        self.bounds = bounds if bounds is not None else Bounds()  # checked when made
        self.matchers = Matchers()
        self._cache: OrderedDict[tuple[str, str], TokenAutomaton] = OrderedDict()  # (pattern, vocab) -> automaton
        # (pattern, vocab) -> (which bound, its value then, the error): the REFUSALS_KEPT last refusals
        self._refused: OrderedDict[tuple[str, str], tuple[str, float, UserError]] = OrderedDict()
        self._lock = threading.Lock()
        self._vocabs: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # tokenizer -> vocabulary()
        self._workers = Compiler()

    def set_bounds(self, **changes) -> Bounds:
        """Change the bounds (``set_bounds(seconds=5)``); returns the previous ones."""
        old = self.bounds
        self.bounds = replace(old, **changes)  # a Bounds checks its values
        self._evict()
        return old

    def vocabulary(self, tokenizer) -> tuple[list[bytes | None], str, int]:
        """:func:`setdlm.decoding.structured.token_bytes.vocabulary` of ``tokenizer``, kept while the tokenizer
        lives."""
        try:
            return self._vocabs[tokenizer]
        except (KeyError, TypeError):
            pass
        out = vocabulary(tokenizer)
        with contextlib.suppress(TypeError):  # not weak-referenceable: recomputed per call
            self._vocabs[tokenizer] = out
        return out

    def automaton(self, constraint: Constraint, tokenizer, max_tokens: int | None = None) -> TokenAutomaton:
        """The token-level automaton of ``constraint`` for ``tokenizer``'s tokens (cached per pattern and
        vocabulary). The tokenizer's special tokens (BOS, EOS, PAD, MASK ...) are never allowed inside the
        output. ``max_tokens``: the most tokens an output has; the automaton then only keeps the words of at
        most that many tokens' bytes (counted repetitions are cut there), so ``.{0,100000}`` for 12 tokens
        compiles as ``.{0,12·longest token}``. A pattern the tokens cannot spell, or past the bounds, is a
        :class:`UserError`."""
        if not isinstance(constraint, Constraint):
            raise TypeError(f"a constraint is made by regex(), json_schema() or choice(), got "
                            f"{type(constraint).__name__}")
        if tokenizer is None:
            raise UserError("constrained decoding needs the model's tokenizer to read tokens as text; the model has "
                            "none")
        _outlines()  # its ImportError here, not as a compiler that fails
        if constraint.pattern is None:
            raise UserError(f"{constraint.refusal}; {LEFT_TO_RIGHT} ({ENGINE}) that compiles it",
                            fields=(constraint.kind,))
        pieces, digest, longest = self.vocabulary(tokenizer)
        pattern = constraint.pattern if max_tokens is None else cut_repetitions(constraint.pattern,
                                                                                max_tokens * longest)
        key = (pattern, digest)
        with self._lock:
            if key in self._cache:
                self._cache.move_to_end(key)
                return self._cache[key]
            refused = self._refused.get(key)
        if refused is not None and refused[1] >= self._limit(refused[0]):
            e = refused[2]
            raise type(e)(str(e), fields=e.fields)  # as compiling again would: the bound is no larger now
        try:
            auto = self._compile(constraint, pattern, pieces, digest)
        except _Refused as r:
            if r.bound is not None:
                with self._lock:
                    self._refused[key] = (r.bound, self._limit(r.bound), r.error)
                    while len(self._refused) > REFUSALS_KEPT:
                        self._refused.popitem(last=False)
            raise r.error from None
        with self._lock:
            self._cache[key] = auto
        self._evict()
        return auto

    def cached_bytes(self) -> int:
        """Bytes of the automata in the cache (at most ``bounds.cache_bytes``)."""
        with self._lock:
            return sum(a.nbytes for a in self._cache.values())

    def _evict(self) -> None:
        with self._lock:
            total = sum(a.nbytes for a in self._cache.values())
            while self._cache and total > self.bounds.cache_bytes:
                total -= self._cache.popitem(last=False)[1].nbytes

    def _limit(self, which: str) -> float:
        """The bound ``which`` (``"seconds"``: what this call may take, ``"memory"``, ``"edges"``) has now; any
        other refusal (a pattern the tokens cannot spell, not a regex) stands whatever the bounds: infinity."""
        bounds = self.bounds
        if which == "seconds":
            given = _SECONDS.get()
            return bounds.seconds if given is None else min(bounds.seconds, given)
        return float(getattr(bounds, which)) if which in ("memory", "edges") else float("inf")

    def _compile(self, constraint: Constraint, pattern: str, pieces: list[bytes | None], digest: str
                 ) -> TokenAutomaton:
        """The automaton, or the refusal: a :class:`_Refused` whose ``bound`` names what a later call may take
        it from the cache of refusals under (``"seconds"``, ``"memory"``, ``"edges"``, ``"always"``); a wait for
        a free compiler is not kept."""
        where = constraint.kind
        reply = self._workers.run(digest, pieces, f"({without_end_mark(pattern, where)})\\x{{FFFF}}",
                                  self._limit("seconds"), self.bounds)
        error: UserError
        if reply[0] == "bound":
            error = CompileBound(f"{where}: compiling {constraint!r} {reply[1]}; simplify it (fewer alternatives, "
                                 f"smaller repetition counts, less nesting) or lower max_tokens", fields=(where,))
            raise _Refused(error, None if reply[2] == "wait" else reply[2])
        if reply[0] == "error":
            kind, message = reply[1], reply[2]
            if kind == "incompatible":
                error = UserError(f"{where}: {constraint!r} cannot be spelled with this tokenizer's tokens: "
                                  f"{message}", fields=(where,))
            elif kind == "size":
                error = CompileBound(f"{where}: compiling {constraint!r} exceeds the size bound ({message}); "
                                     f"simplify it or lower max_tokens", fields=(where,))
            else:
                cls = CompileBound if where == "json_schema" else UserError  # a schema's regex is ours: a size limit
                error = cls(f"{where}: {constraint!r}: invalid regular expression: {message}", fields=(where,))
            raise _Refused(error, "edges" if kind == "size" else "always")
        return _tables(*reply[1:], V=len(pieces))


def _tables(initial: int, finals: list[int], raw: bytes, *, V: int) -> TokenAutomaton:
    """The automaton's tensors from the compiling process's reply (outlines-core's state ids, its edges)."""
    e = torch.zeros(0, 3, dtype=torch.long)
    if raw:
        e = torch.frombuffer(bytearray(raw), dtype=torch.long).reshape(-1, 3)  # (E, 3) outlines' state ids
    states = torch.unique(torch.cat([e[:, 0], e[:, 2], torch.tensor(finals + [initial], dtype=torch.long)]))  # sorted
    src, dst = torch.searchsorted(states, e[:, 0].contiguous()), torch.searchsorted(states, e[:, 2].contiguous())
    e = torch.stack([src, e[:, 1], dst], 1)  # (E, 3) src, tok, dst as 0..K-1
    K = states.numel()
    final = torch.zeros(K, dtype=torch.bool)
    final[torch.searchsorted(states, torch.tensor(finals, dtype=torch.long))] = True
    by_src = e[torch.argsort(e[:, 0] * (V + 1) + e[:, 1])]
    by_tok = e[torch.argsort(e[:, 1] * (K + 1) + e[:, 0])]
    pairs = torch.unique(e[:, 0] * K + e[:, 2])
    return TokenAutomaton(
        initial=int(torch.searchsorted(states, torch.tensor(initial))), final=final,
        src_ptr=_ptr(by_src[:, 0], K), src_tok=by_src[:, 1].contiguous(), src_dst=by_src[:, 2].contiguous(),
        tok_ptr=_ptr(by_tok[:, 1], V), tok_src=by_tok[:, 0].contiguous(), tok_dst=by_tok[:, 2].contiguous(),
        pair_src=pairs // K, pair_dst=pairs % K, vocab_size=V)


DEFAULT_COMPILER = ConstraintCompiler()  # the library's: generate, infill, fill and the functions below


def automaton(constraint: Constraint, tokenizer, max_tokens: int | None = None) -> TokenAutomaton:
    """:meth:`ConstraintCompiler.automaton` of :data:`DEFAULT_COMPILER`."""
    return DEFAULT_COMPILER.automaton(constraint, tokenizer, max_tokens)


def set_bounds(**changes) -> Bounds:
    """:meth:`ConstraintCompiler.set_bounds` of :data:`DEFAULT_COMPILER` (``set_bounds(seconds=5)``); returns the
    previous bounds."""
    return DEFAULT_COMPILER.set_bounds(**changes)


def _ptr(keys: Tensor, n: int) -> Tensor:
    """CSR row pointers (n+1,) of sorted ``keys`` in ``0..n-1``."""
    return torch.cat([torch.zeros(1, dtype=torch.long), torch.bincount(keys, minlength=n).cumsum(0)])
