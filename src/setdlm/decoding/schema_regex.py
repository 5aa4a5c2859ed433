"""A JSON Schema as the regular expression of the JSON documents that validate against it (docs/decoding.md
"Constrained decoding", "JSON Schema").

outlines-core (``build_regex_from_schema``) writes the structure (objects, arrays, ``enum``, ``const``,
``$ref``, ``anyOf``); the leaves it would leave unenforced or get wrong are written here and spliced in:

* integers with ``minimum``/``maximum``/``exclusiveMinimum``/``exclusiveMaximum`` as exact digit-range
  regexes, and ``multipleOf`` by listing the multiples of a bounded range (at most ``MAX_LISTED``);
* numbers with bounds: the integers of the range, and decimals of at most ``NUMBER_PRECISION``
  fraction digits whose every value is inside it (no exponent; a decimal within 1 of an open end may be
  left out: what is written always validates);
* strings with a ``pattern`` (made safe inside a JSON string: no raw ``"``, ``\\`` or control character),
  with ``minLength``/``maxLength`` when the pattern is one character class repeated, and the ``format``\\ s
  of :data:`FORMATS` (date, date-time, time, email, uuid, ipv4);
* ``oneOf`` of disjoint branches (different types, or objects told apart by a required ``const``
  property) as ``anyOf``; a ``required`` name absent from ``properties`` as a scalar property
  (``additionalProperties`` permitting); ``minProperties``/``maxProperties`` that the required and
  declared properties already satisfy.

Everything else that a regular expression would silently not enforce is a :class:`UserError` naming the
keyword and its path, so that every output validates.
"""

from __future__ import annotations

import json
import math
import re

from ..errors import UserError
from .compiler import regex_atoms

MAX_NESTING = 64  # levels of a schema (a deeper one is refused, never a RecursionError)
MAX_LISTED = 1000  # multiples of multipleOf listed at most
NUMBER_PRECISION = 6  # fraction digits of a bounded number
UNENFORCED = ("uniqueItems", "contains", "minContains", "maxContains", "not", "if", "then", "else",
              "dependentRequired", "dependentSchemas", "dependencies", "patternProperties", "propertyNames",
              "unevaluatedProperties", "unevaluatedItems", "additionalItems", "$dynamicRef", "$recursiveRef")
NUMERIC = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf")
_ANNOTATIONS = {"title", "description", "default", "examples", "$comment", "$schema", "$id", "id", "deprecated",
                "readOnly", "writeOnly", "$anchor", "discriminator", "contentMediaType", "contentEncoding"}
# (keywords that constrain nothing; OpenAPI's discriminator only names the property a oneOf's branches differ by)
_IMPLIED = {"string": ("pattern", "format", "minLength", "maxLength"), "number": NUMERIC,
            "array": ("items", "prefixItems", "minItems", "maxItems"),
            "object": ("properties", "required", "additionalProperties", "minProperties", "maxProperties")}
_STRUCTURAL = ("enum", "const", "$ref", "anyOf", "oneOf", "allOf")  # they decide the type themselves
ANY = {"anyOf": [{"type": t} for t in ("string", "number", "boolean", "null", "array", "object")]}  # any JSON value
_JSON_UNSAFE = r'"\\\x00-\x1F\x7F-\x9F'  # characters a JSON string's text holds only escaped (and C1 controls)
_CHAR = rf"[^{_JSON_UNSAFE}]"

_DATE = ("[1-9][0-9]{3}-(?:(?:0[1-9]|1[0-2])-(?:0[1-9]|1[0-9]|2[0-8])|(?:0[13-9]|1[0-2])-(?:29|30)"
         "|(?:0[13578]|1[02])-31)")
_TIME = "(?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](?:\\.[0-9]{1,6})?(?:Z|[+-](?:[01][0-9]|2[0-3]):[0-5][0-9])"
_OCTET = "(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9][0-9]|[0-9])"
_LABEL = "[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?"
FORMATS = {  # the text of a string of each format (a subset of the format where the full one is not regular)
    "date": _DATE,
    "time": _TIME,
    "date-time": f"{_DATE}T{_TIME}",
    "email": f"[a-z0-9]+(?:[._+-][a-z0-9]+)*@{_LABEL}(?:\\.{_LABEL})*\\.[a-z]{{2,12}}",
    "uuid": "[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}",
    "ipv4": f"{_OCTET}(?:\\.{_OCTET}){{3}}",
}


def schema_regex(schema: dict, *, max_depth: int, whitespace: str | None) -> str:
    """The regular expression of the JSON texts that validate against ``schema`` (checked already against
    the meta-schema); a :class:`UserError` naming keyword and path for what it cannot enforce."""
    import outlines_core as oc

    check_nesting(schema)
    leaves: dict[str, str] = {}
    text = json.dumps(schema)
    mark = "setdlmleaf"
    while mark in text:
        mark += "x"
    rewritten = _rewrite(schema, "(root)", leaves, mark, schema)
    build = oc.json_schema.build_regex_from_schema
    try:
        pattern = build(json.dumps(rewritten), whitespace, max_recursion_depth=max_depth)
        for name, leaf in leaves.items():  # a leaf under a $def never referenced is not in it
            pattern = pattern.replace(build(json.dumps({"const": name}), whitespace), f"({leaf})")
    except (ValueError, TypeError) as e:
        raise UserError(f"json_schema: {e}", fields=("json_schema",)) from None
    if mark in pattern:
        raise UserError("json_schema: a constrained leaf could not be placed in the schema's expression",
                        fields=("json_schema",))
    return pattern


def check_nesting(schema) -> None:
    """A :class:`UserError` for a schema nested more than :data:`MAX_NESTING` levels (checked without
    recursion)."""
    todo = [(schema, 1, "(root)")]
    while todo:
        node, depth, where = todo.pop()
        if depth > MAX_NESTING:
            raise UserError(f"json_schema: nested more than {MAX_NESTING} levels at {where[:120]}...; flatten it or "
                            f"use $ref", fields=("json_schema",))
        if isinstance(node, dict):
            todo.extend((v, depth + 1, f"{where}/{k}") for k, v in node.items())
        elif isinstance(node, list):
            todo.extend((v, depth + 1, f"{where}/{i}") for i, v in enumerate(node))


def _refuse(key: str, where: str, why: str):
    raise UserError(f"json_schema: {key!r} at {where} cannot be enforced by the token automaton: {why}",
                    fields=("json_schema",))


def _rewrite(node, where: str, leaves: dict, mark: str, root: dict):
    """``node`` with the leaves written here replaced by ``{"const": <name>}`` (their regex in ``leaves``),
    and what cannot be enforced refused."""
    if isinstance(node, list):
        return [_rewrite(v, f"{where}/{i}", leaves, mark, root) for i, v in enumerate(node)]
    if node is True or (isinstance(node, dict) and set(node) <= _ANNOTATIONS):
        return ANY  # outlines-core's own free-form value leaves its alternation ungrouped ({"a": {}} -> {1.5})
    if not isinstance(node, dict):
        return node
    for key in UNENFORCED:
        if key in node:
            _refuse(key, where, "remove it, or express it with enum, const or pattern")
    node = dict(node)
    beside = [k for k in node if k not in _ANNOTATIONS and k not in _STRUCTURAL and k not in ("$defs", "definitions")]
    structural = [k for k in _STRUCTURAL[2:] if k in node]  # $ref, anyOf, oneOf, allOf
    if beside == ["type"] and structural in (["anyOf"], ["oneOf"]) and isinstance(node["type"], str) and \
            all(isinstance(b, dict) and not any(k in b for k in ("type",) + _STRUCTURAL) for b in node[structural[0]]):
        kind = node.pop("type")  # into each branch, where it is checked
        node[structural[0]] = [dict(b, type=kind) for b in node[structural[0]]]
        beside = []
    if structural and beside:
        _refuse(beside[0], where, f"beside {structural[0]!r} it would be left unchecked; move it into the "
                                  f"referenced schema or each branch")
    implied = {t for t, keys in _IMPLIED.items() if any(k in node for k in keys)}
    if "type" not in node and len(implied) == 1 and not any(k in node for k in _STRUCTURAL):
        node["type"] = implied.pop()  # the keywords bind that type only: writing one of it is a valid choice
    if isinstance(node.get("allOf"), list) and len(node["allOf"]) > 1:
        _refuse("allOf", where, f"the intersection of {len(node['allOf'])} schemas is not expressed; merge them")
    if isinstance(node.get("oneOf"), list) and len(node["oneOf"]) > 1:
        if not _disjoint([_resolved(b, root) for b in node["oneOf"]]):
            _refuse("oneOf", where, "its branches may overlap (exactly one must match); make them disjoint (other "
                                    "types, or a required const property) or use anyOf")
        node["anyOf"] = node.pop("oneOf")
    leaf = _leaf(node, where)
    if leaf is not None:
        name = f"{mark}{len(leaves)}"
        leaves[name] = leaf
        return {"const": name}
    if node.get("type") == "object" or "properties" in node or "required" in node:
        node = _object(node, where)
    for key, v in list(node.items()):
        if key in ("properties", "$defs", "definitions") and isinstance(v, dict):
            node[key] = {k: _rewrite(s, f"{where}/{key}/{k}", leaves, mark, root) for k, s in v.items()}
        elif key in ("items", "prefixItems", "additionalProperties", "anyOf", "oneOf", "allOf") and \
                isinstance(v, (dict, list)):
            node[key] = _rewrite(v, f"{where}/{key}", leaves, mark, root)
    return node


def _object(node: dict, where: str) -> dict:
    props = dict(node.get("properties") or {})
    required = list(node.get("required") or [])
    extra = node.get("additionalProperties", True)
    for name in required:
        if name not in props:
            if extra is False:
                _refuse("required", where, f"{name!r} is required but additionalProperties is false and it is not "
                                           f"in properties: no object validates")
            props[name] = extra if isinstance(extra, dict) else {"type": ["string", "number", "boolean", "null"]}
    if props:
        node["properties"] = props
    lo, hi = node.pop("minProperties", 0), node.pop("maxProperties", None)
    if lo > len(set(required)):
        _refuse("minProperties", where, f"{lo} properties are needed but only {len(set(required))} are required; "
                                        f"list that many in required")
    if hi is not None and (extra is not False or len(props) > hi):
        _refuse("maxProperties", where, f"at most {hi} properties, but {len(props)} are declared and "
                                        f"additionalProperties is {extra is not False}; declare at most that many "
                                        f"with additionalProperties false")
    return node


def _resolved(branch, root: dict):
    """``branch``, or the schema its local ``$ref`` (``#/$defs/..``, ``#/definitions/..``) names."""
    ref = branch.get("$ref") if isinstance(branch, dict) else None
    if not isinstance(ref, str) or not ref.startswith("#/"):
        return branch
    node = root
    for part in ref[2:].split("/"):
        node = node.get(part.replace("~1", "/").replace("~0", "~")) if isinstance(node, dict) else None
    return node if isinstance(node, dict) else branch


def _disjoint(branches: list) -> bool:
    """Whether no JSON value validates against two of ``branches`` (a sufficient check: distinct single
    types, integer and number apart, or objects whose same required property has distinct consts)."""
    types = [b.get("type") if isinstance(b, dict) else None for b in branches]
    if all(isinstance(t, str) for t in types) and len(set(types)) == len(types) and \
            not {"integer", "number"} <= set(types):
        return True
    if not all(isinstance(b, dict) and b.get("type") == "object" for b in branches):
        return False
    for key in branches[0].get("required", []):
        consts = []
        for b in branches:
            sub = (b.get("properties") or {}).get(key)
            if key not in b.get("required", []) or not isinstance(sub, dict) or "const" not in sub:
                break
            consts.append(json.dumps(sub["const"], sort_keys=True))
        else:
            if len(set(consts)) == len(consts):
                return True
    return False


def _leaf(node: dict, where: str) -> str | None:
    """The regex of a number or string schema whose keywords outlines-core would not enforce exactly (None:
    leave it to outlines-core)."""
    kind = node.get("type")
    numeric = [k for k in NUMERIC if k in node]
    if numeric:
        if kind not in ("integer", "number"):
            _refuse(numeric[0], where, "bounds need \"type\": \"integer\" or \"number\" (one type)")
        if "enum" in node or "const" in node:
            _refuse(numeric[0], where, "give the enum's values inside the bounds instead")
        return _number(node, where, integer=kind == "integer")
    strings = [k for k in ("pattern", "format", "minLength", "maxLength") if k in node]
    if not strings or "enum" in node or "const" in node:
        return None
    if isinstance(kind, list) and "string" in kind:
        _refuse(strings[0], where, "string keywords with a list of types; write anyOf of a string schema and the "
                                   "others")
    if kind != "string":  # they do not apply to the other types
        return None
    lo, hi = node.get("minLength", 0), node.get("maxLength")
    fmt, pat = node.get("format"), node.get("pattern")
    if fmt is not None:
        if fmt not in FORMATS:
            _refuse("format", where, f"format {fmt!r} is not one of {sorted(FORMATS)}; use a pattern")
        if pat is not None or "minLength" in node or "maxLength" in node:
            _refuse("format", where, "a format together with pattern, minLength or maxLength; give one of them")
        return f'"{FORMATS[fmt]}"'
    if pat is None:
        return None  # outlines-core's string with its length bounds
    body = strip_anchors(pat)
    if ("minLength" in node or "maxLength" in node) and not _lengths_implied(body, lo, hi):
        m = re.fullmatch(r"(\[(?:\\.|[^\]\\])*\]|\\.|[^\\()\[\]|*+?{}^$])(\*|\+|\?|\{(\d+)(?:(,)(\d*))?\})", body)
        if m is None:
            _refuse("maxLength" if hi is not None else "minLength", where,
                    "lengths combine only with a pattern that repeats one character class (like [a-z]+); fold the "
                    "length into the pattern ({m,n})")
        q = m.group(2)
        a, b = {"*": (0, None), "+": (1, None), "?": (0, 1)}.get(q, (None, None))
        if q.startswith("{"):
            a = int(m.group(3))
            b = a if m.group(4) is None else (int(m.group(5)) if m.group(5) else None)
        lo2, hi2 = max(a, lo), (hi if b is None else b if hi is None else min(b, hi))
        if hi2 is not None and lo2 > hi2:
            _refuse("maxLength", where, f"no string of the pattern has between {lo} and {hi} characters")
        body = f"{json_safe(m.group(1), where)}{{{lo2},{'' if hi2 is None else hi2}}}"
        return f'"{body}"'
    return f'"(?:{json_safe(body, where)})"'


def _lengths_implied(pattern: str, lo: int, hi: int | None) -> bool:
    """Whether every string of ``pattern`` (read by Python's parser, the common syntax) already has between
    ``lo`` and ``hi`` characters."""
    try:
        short, long = re._parser.parse(pattern).getwidth()
    except (re.error, AttributeError, RecursionError):
        return False
    return short >= lo and (hi is None or long <= hi)


def strip_anchors(pattern: str) -> str:
    """``pattern`` without a leading ``^`` and a trailing unescaped ``$`` (the whole text is matched)."""
    body = pattern[1:] if pattern.startswith("^") else pattern
    if body.endswith("$") and (len(body) - 1 - len(body[:-1].rstrip("\\"))) % 2 == 0:
        body = body[:-1]
    return body


def json_safe(pattern: str, where: str) -> str:
    """``pattern`` (a string's content) as the text a JSON string spells it with: ``"`` and ``\\`` as
    their escapes, and no other character a JSON string holds only escaped (``.``, negated classes and
    ``\\S`` ``\\D`` ``\\W`` lose them; ``\\s`` is a space). The output is a subset of the pattern's strings,
    which is what validates; a construct that cannot be rewritten is refused."""
    out = []
    for i, atom in regex_atoms(pattern):
        c = pattern[i]
        if c == "\\":
            e = pattern[i + 1:i + 2]
            if e in ("d", "w"):
                out.append("\\" + e)
            elif e == "s":
                out.append(" ")
            elif e in ("D", "W", "S"):
                out.append(f"[\\{e}&&{_CHAR}]")
            elif e == "\\":  # each spelled as its JSON escape, grouped for a quantifier after it
                out.append("(?:\\\\\\\\)")
            elif e == '"':
                out.append('(?:\\\\")')
            elif e in ("n", "t", "r"):
                out.append(f"(?:\\\\{e})")
            elif e and not e.isalnum():
                out.append("\\" + e)
            else:
                _refuse("pattern", where, f"the escape \\{e} is not supported inside a JSON string")
        elif atom is None:
            _refuse("pattern", where, "an unclosed character class")
        elif c == "[":
            out.append(f"[{atom}&&{_CHAR}]")  # the class, JSON-safe characters only
        elif c == ".":
            out.append(_CHAR)
        elif c == '"':
            out.append('(?:\\\\")')
        elif c in "^$":
            _refuse("pattern", where, f"an anchor {c} inside the pattern (only at its ends)")
        elif ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F:
            _refuse("pattern", where, f"the control character {c!r}")
        else:
            out.append(c)
    return "".join(out)


# ---------------------------------------------------------------------------------------------------------
# numbers
# ---------------------------------------------------------------------------------------------------------


def _number(node: dict, where: str, integer: bool) -> str:
    lo, lo_open, hi, hi_open = _bounds(node, where)
    step = node.get("multipleOf")
    if step is not None:
        if not (isinstance(step, int) or float(step).is_integer()):
            _refuse("multipleOf", where, f"multipleOf {step} is not an integer (a decimal step is not checked exactly "
                                         f"in floating point)")
        integer, step = True, int(step)
    ilo = None if lo is None else (math.floor(lo) + 1 if lo_open else math.ceil(lo))
    ihi = None if hi is None else (math.ceil(hi) - 1 if hi_open else math.floor(hi))
    if ilo is not None and ihi is not None and ilo > ihi and integer:
        _refuse("minimum", where, f"no integer lies between the bounds {lo} and {hi}")
    if step is not None and step != 1:
        if ilo is None or ihi is None or (ihi - ilo) // step > MAX_LISTED:
            _refuse("multipleOf", where, f"multipleOf {step} is enforced by listing the multiples of a bounded range "
                                         f"(at most {MAX_LISTED}); bound it with minimum and maximum")
        first = -(-ilo // step) * step
        values = [str(v) for v in range(first, ihi + 1, step)]
        if not values:
            _refuse("multipleOf", where, f"no multiple of {step} lies between the bounds")
        return "|".join(sorted(values, key=len, reverse=True))
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
