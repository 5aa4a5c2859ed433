"""Numbers of a JSON Schema as regular expressions of their JSON spellings (docs/decoding.md "JSON Schema"):
integers of a range as exact digit-range regexes, numbers of a range as its integers and decimals of at most
``NUMBER_PRECISION`` fraction digits, ``multipleOf`` by listing the multiples of a bounded range (at most
``MAX_LISTED``; a decimal step's multiples only where jsonschema's floating-point check accepts them) or, for
an integer step dividing a power of ten, by the last digits."""

from __future__ import annotations

import math
from decimal import Decimal
from fractions import Fraction
from typing import NoReturn

from ....errors import UserError

MAX_LISTED = 1000  # multiples of multipleOf listed at most
NUMBER_PRECISION = 6  # fraction digits of a bounded number
INTEGER = "-?(?:0|[1-9][0-9]*)"
NUMBER = "-?(?:0|[1-9][0-9]*)(?:\\.[0-9]+)?(?:[eE][+-]?[0-9]+)?"


def _refuse(key: str, where: str, why: str) -> NoReturn:
    raise UserError(f"json_schema: {key!r} at {where} cannot be enforced by the token automaton: {why}",
                    fields=("json_schema",))




def number_regex(node: dict, where: str, integer: bool) -> str:
    """The JSON spellings of the numbers (integers when ``integer``) that satisfy ``node``'s bounds and
    ``multipleOf``; a :class:`UserError` naming the keyword where they are not written exactly."""
    lo, lo_open, hi, hi_open = _bounds(node, where)
    step = node.get("multipleOf")
    if step is not None and not (isinstance(step, int) or float(step).is_integer()):
        return _decimal_multiples(step, lo, lo_open, hi, hi_open, where, integer)
    if step is not None:
        integer, step = True, int(step)
    ilo = None if lo is None else (math.floor(lo) + 1 if lo_open else math.ceil(lo))
    ihi = None if hi is None else (math.ceil(hi) - 1 if hi_open else math.floor(hi))
    if ilo is not None and ihi is not None and ilo > ihi and integer:
        _refuse("minimum", where, f"no integer lies between the bounds {lo} and {hi}")
    if step is not None and step != 1:
        if ilo is None and ihi is None:
            return _last_digits(step, where)
        if ilo is None or ihi is None or (ihi - ilo) // step > MAX_LISTED:
            _refuse("multipleOf", where, f"multipleOf {step} is enforced by listing the multiples of a bounded range "
                                         f"(at most {MAX_LISTED}) or, unbounded, by the last digits of a step that "
                                         f"divides a power of ten; bound it with minimum and maximum")
        first = -(-ilo // step) * step
        values = [str(v) for v in range(first, ihi + 1, step)]
        if not values:
            _refuse("multipleOf", where, f"no multiple of {step} lies between the bounds")
        return "|".join(sorted(values, key=len, reverse=True))
    if lo is None and hi is None:
        return INTEGER if integer else NUMBER
    parts = [] if ilo is not None and ihi is not None and ilo > ihi else [integer_regex(ilo, ihi)]
    if not integer:  # decimals I.F (F ending in 1-9): in (I, I+1) for I >= 0, in (I-1, I) for I < 0
        frac = f"\\.[0-9]{{0,{NUMBER_PRECISION - 1}}}[1-9]"
        flo = None if lo is None else math.ceil(lo)
        fhi = None if hi is None else math.floor(hi)
        pos_lo, pos_hi = max(flo if flo is not None else 0, 0), None if fhi is None else fhi - 1
        if pos_hi is None or pos_lo <= pos_hi:
            parts.insert(0, f"(?:{_nonneg(pos_lo, pos_hi)}){frac}")
        neg_lo, neg_hi = None if flo is None else flo + 1, -1 if fhi is None else min(fhi, -1)
        if neg_lo is None or neg_lo <= neg_hi:
            parts.insert(0, f"-(?:{_nonneg(-neg_hi, None if neg_lo is None else -neg_lo)}){frac}")
    if not parts:
        _refuse("minimum", where, f"no number of at most {NUMBER_PRECISION} decimals lies between the bounds")
    return "|".join(parts)


def _last_digits(step: int, where: str) -> str:
    """The integers divisible by ``step`` (unbounded) where ``step`` divides 10^k (k <= 3): those whose last
    k digits are a multiple of it."""
    k = next((k for k in range(4) if 10 ** k % step == 0), None)
    if k is None:
        _refuse("multipleOf", where, f"multipleOf {step} without bounds: only a step dividing 1000 is written by its "
                                     f"last digits; bound it with minimum and maximum")
    small = [str(v) for v in range(step, 10 ** k, step)]
    tails = [str(v).zfill(k) for v in range(0, 10 ** k, step)]
    big = f"[1-9][0-9]*(?:{'|'.join(tails)})"
    return f"0|-?(?:{'|'.join([big] + small[::-1])})"


def _decimal_multiples(step, lo, lo_open, hi, hi_open, where: str, integer: bool) -> str:
    """The multiples of a fractional ``step`` in a bounded range, each written as its shortest decimal and kept
    only where jsonschema's own floating-point check (``value / step`` integral) accepts it."""
    if lo is None or hi is None:
        _refuse("multipleOf", where, f"multipleOf {step} (a fraction) is enforced by listing the multiples of a "
                                     f"bounded range; bound it with minimum and maximum")
    exact = Fraction(Decimal(repr(step)))
    first, last = math.ceil(Fraction(Decimal(repr(lo))) / exact), math.floor(Fraction(Decimal(repr(hi))) / exact)
    if last - first > MAX_LISTED:
        _refuse("multipleOf", where, f"more than {MAX_LISTED} multiples of {step} lie between the bounds")
    values = []
    for k in range(first, last + 1):
        text = _decimal_text(k * exact)
        v = json_number(text)
        if (lo_open and v <= lo) or (hi_open and v >= hi) or v < lo or v > hi or (integer and isinstance(v, float)):
            continue
        q = v / step
        if int(q) == q:  # what jsonschema checks for a float step
            values.append(text)
    if not values:
        _refuse("multipleOf", where, f"no multiple of {step} between the bounds passes the floating-point check")
    return "|".join(v.replace(".", "\\.") for v in sorted(values, key=len, reverse=True))


def _decimal_text(x: Fraction) -> str:
    """``x`` (a terminating decimal) in JSON's spelling: no exponent, no trailing zeros, an integer bare."""
    d = Decimal(x.numerator) / Decimal(x.denominator)
    text = format(d.normalize(), "f")
    return "0" if text in ("-0", "0") else text


def json_number(text: str) -> int | float:
    """The Python value ``json.loads`` gives the number ``text``."""
    return float(text) if any(c in text for c in ".eE") else int(text)


def _bounds(node: dict, where: str) -> tuple:
    lo = hi = None
    lo_open = hi_open = False
    for key in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
        v = node.get(key)
        if v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            _refuse(key, where, f"a bound is a finite number (draft 6+), got {v!r}")
        if key.endswith("inimum") and (lo is None or v > lo or (v == lo and key.startswith("exclusive"))):
            lo, lo_open = v, key.startswith("exclusive")
        if key.endswith("aximum") and (hi is None or v < hi or (v == hi and key.startswith("exclusive"))):
            hi, hi_open = v, key.startswith("exclusive")
    return lo, lo_open, hi, hi_open


def integer_regex(lo: int | None, hi: int | None) -> str:
    """The decimal integers (JSON's spelling: no leading zero, ``-`` for negatives) in ``[lo, hi]`` (None:
    unbounded), ``lo <= hi``; longer spellings first (the automaton's leftmost-first alternation)."""
    parts = []
    if lo is None or lo < 0:  # negatives: -m for m in [max(1, -hi), -lo]
        parts.append(f"-(?:{_nonneg(max(1, -hi) if hi is not None else 1, None if lo is None else -lo)})")
    if hi is None or hi >= 0:
        parts.append(_nonneg(max(lo, 0) if lo is not None else 0, hi))
    return "|".join(parts)


def _nonneg(lo: int, hi: int | None) -> str:
    """Integers in ``[lo, hi]`` (``0 <= lo``; hi None: unbounded), without leading zeros."""
    if hi is None:  # [lo, 10^d - 1], then every integer of more digits
        d = len(str(lo))
        return f"[1-9][0-9]{{{d},}}|" + _nonneg(lo, 10 ** d - 1)
    alts = []
    for d in range(len(str(hi)), len(str(lo)) - 1, -1):
        a, b = max(lo, 10 ** (d - 1) if d > 1 else 0), min(hi, 10 ** d - 1)
        if a <= b:
            alts += _same_length(str(a), str(b))
    return "|".join(alts)


def _same_length(a: str, b: str) -> list[str]:
    """Alternatives spelling the digit strings from ``a`` to ``b`` (of equal length, ``a <= b``)."""
    n = len(a)
    if n == 1:
        return [_digits(int(a), int(b))]
    if a[0] == b[0]:
        return [a[0] + r for r in _same_length(a[1:], b[1:])]
    out, first, last = [], int(a[0]), int(b[0])
    if a[1:] != "0" * (n - 1):
        out += [a[0] + r for r in _same_length(a[1:], "9" * (n - 1))]
        first += 1
    full = b[1:] == "9" * (n - 1)
    if first <= (last if full else last - 1):
        out.append(_digits(first, last if full else last - 1) + ("[0-9]" if n == 2 else f"[0-9]{{{n - 1}}}"))
    if not full:
        out += [b[0] + r for r in _same_length("0" * (n - 1), b[1:])]
    return out


def _digits(x: int, y: int) -> str:
    return str(x) if x == y else f"[{x}-{y}]"
