"""Strings of a JSON Schema as regular expressions of their JSON text (docs/decoding.md "JSON Schema"):
``pattern`` made safe inside a JSON string, lengths, ``format`` (:mod:`setdlm.decoding.structured.schema.formats`),
strings other than a finite set (a property name not declared, a value not in an excluded ``enum``), and
literals (a value's JSON text, with the schema's whitespace)."""

from __future__ import annotations

import json
import re

from ..compiler import regex_atoms
from .formats import format_regex, undefined
from .merge import Unsatisfiable, refuse

_JSON_UNSAFE = r'"\\\x00-\x1F\x7F-\x9F'  # characters a JSON string's text holds only escaped (and C1 controls)
CHAR = rf"[^{_JSON_UNSAFE}]"
STRING_CHAR = rf'(?:{CHAR}|\\["\\/bfnrt])'  # one character of a JSON string's text (an escape is one)
_META = set("\\.+*?()|[]{}^$#&-~")  # characters a literal escapes (Rust regex syntax)
STRING_KEYWORDS = ("pattern", "format", "minLength", "maxLength")


def literal(text: str) -> str:
    """``text`` as a regex matching exactly it."""
    return "".join("\\" + c if c in _META else c for c in text)


def json_literal(value, ws: str) -> str:
    """The regex of ``value``'s JSON text, with ``ws`` between the tokens of an array or object."""
    if isinstance(value, dict):
        inner = f"{ws},".join(f"{ws}{literal(json.dumps(k, ensure_ascii=False))}{ws}:{ws}{json_literal(v, ws)}"
                              for k, v in value.items())
        return f"\\{{{inner}{ws}\\}}"
    if isinstance(value, list):
        inner = f"{ws},{ws}".join(json_literal(v, ws) for v in value)
        return f"\\[{ws}{inner}{ws}\\]"
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e16:
        return literal(str(int(value))) + "(?:\\.0)?"
    return literal(json.dumps(value, ensure_ascii=False))


def except_strings(names, lo: int = 0, hi: int | None = None) -> str | None:
    """The text (quotes included) of the JSON strings of ``lo`` to ``hi`` characters, written without
    escapes, that are none of ``names``: a trie of the names, left anywhere but at a name's end (None: no
    such string)."""
    trie: dict = {}
    for name in names:
        if any(c in '"\\' or ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F for c in name):
            continue  # never written unescaped, so never among what is written here
        node = trie
        for c in name:
            node = node.setdefault(c, {})
        node["end"] = True

    def rest(node: dict, depth: int) -> str | None:
        alts = [] if node.get("end") or depth < lo or (hi is not None and depth > hi) else [""]
        if hi is None or depth < hi:
            kids = [c for c in node if c != "end"]
            other = f"[^{_JSON_UNSAFE}{''.join(literal(c) for c in kids)}]" if kids else CHAR
            top = "" if hi is None else hi - depth - 1
            alts.append(f"{other}{CHAR}{{{max(lo - depth - 1, 0)},{top}}}")
            alts += [literal(c) + r for c in kids if (r := rest(node[c], depth + 1)) is not None]
        return "(?:" + "|".join(alts) + ")" if alts else None

    body = rest(trie, 0)
    return None if body is None else f'"{body}"'


def string_regex(node: dict, where: str, excluded: list[str]) -> str:
    """The text (quotes included) of the strings ``node`` (a flat node of type string) lets through, none
    of ``excluded``."""
    lo, hi = node.get("minLength", 0), node.get("maxLength")
    fmt, pat = node.get("format"), node.get("pattern")
    if fmt is not None and undefined(fmt):
        fmt = None  # an annotation (schema_formats)
    if excluded and (fmt is not None or pat is not None):
        refuse("not", where, "strings other than a list of values, with a pattern or format beside it")
    if excluded:
        text = except_strings(excluded, lo, hi)
        if text is None:
            raise Unsatisfiable("not", where, "every string of the lengths allowed is excluded")
        return text
    if fmt is not None:
        body = format_regex(fmt)
        if body is None:
            refuse("format", where, f"format {fmt!r} is not written here; use a pattern")
        if pat is not None:
            refuse("format", where, "a format together with a pattern; give one of them")
        if ("minLength" in node or "maxLength" in node) and not lengths_implied(body, lo, hi):
            refuse("format", where, "a format together with minLength or maxLength; give one of them")
        return f'"(?:{body})"'
    if pat is None:
        return f'"{STRING_CHAR}{{{lo},{"" if hi is None else hi}}}"' if lo or hi is not None else f'"{STRING_CHAR}*"'
    body = strip_anchors(pat)
    if ("minLength" in node or "maxLength" in node) and not lengths_implied(body, lo, hi):
        m = re.fullmatch(r"(\[(?:\\.|[^\]\\])*\]|\\.|[^\\()\[\]|*+?{}^$])(\*|\+|\?|\{(\d+)(?:(,)(\d*))?\})", body)
        if m is None:
            refuse("maxLength" if hi is not None else "minLength", where,
                   "lengths combine only with a pattern that repeats one character class (like [a-z]+); fold the "
                   "length into the pattern ({m,n})")
        q = m.group(2)
        a, b = {"*": (0, None), "+": (1, None), "?": (0, 1)}.get(q, (None, None))
        if q.startswith("{"):
            a = int(m.group(3))
            b = a if m.group(4) is None else (int(m.group(5)) if m.group(5) else None)
        lo2, hi2 = max(a, lo), (hi if b is None else b if hi is None else min(b, hi))
        if hi2 is not None and lo2 > hi2:
            refuse("maxLength", where, f"no string of the pattern has between {lo} and {hi} characters")
        return f'"{json_safe(m.group(1), where)}{{{lo2},{"" if hi2 is None else hi2}}}"'
    return f'"(?:{json_safe(body, where)})"'


def lengths_implied(pattern: str, lo: int, hi: int | None) -> bool:
    """Whether every string of ``pattern`` (read by Python's parser, the common syntax) already has between
    ``lo`` and ``hi`` characters."""
    try:
        short, long = re._parser.parse(pattern).getwidth()  # type: ignore[attr-defined]  # CPython 3.11's parser, unstubbed
    except (re.error, AttributeError, RecursionError, OverflowError):
        return False
    return short >= lo and (hi is None or long <= hi)


def strip_anchors(pattern: str) -> str:
    """``pattern`` without a leading ``^`` and a trailing unescaped ``$`` (the whole text is matched)."""
    body = pattern[1:] if pattern.startswith("^") else pattern
    if body.endswith("$") and (len(body) - 1 - len(body[:-1].rstrip("\\"))) % 2 == 0:
        body = body[:-1]
    return body


def key_regex(pattern: str, where: str) -> str:
    """The text (quotes included) of property names that ``pattern`` (of ``patternProperties``, which
    searches) finds a match in: any characters before an unanchored start and after an unanchored end."""
    head = "" if pattern.startswith("^") else f"{CHAR}*"
    tail = "" if strip_anchors(pattern) != pattern[1 if pattern.startswith("^") else 0:] else f"{CHAR}*"
    body = json_safe(strip_anchors(pattern), where, boundary=not head and not tail)  # searched: anchors matter
    return f'"{head}(?:{body}){tail}"'


def json_safe(pattern: str, where: str, boundary: bool = True) -> str:
    """``pattern`` (a string's content) as the text a JSON string spells it with: ``"`` and ``\\`` as
    their escapes, and no other character a JSON string holds only escaped (``.``, negated classes and
    ``\\S`` ``\\D`` ``\\W`` lose them; ``\\s`` is a space). The output is a subset of the pattern's strings,
    which is what validates; a construct that cannot be rewritten is refused. With ``boundary``, a ``^``
    opening or a ``$`` closing a top-level alternative (``^a$|^b$``) is dropped: the text is matched whole."""
    out = []
    for i, atom in regex_atoms(pattern):
        c = pattern[i]
        if atom is None:  # the walk stops at an unclosed class or \p{
            refuse("pattern", where, "an unclosed \\p{...}" if c == "\\" else "an unclosed character class")
        if c == "\\":
            out.append(_escape(pattern[i + 1:i + 2], atom, where))
        elif c == "[":
            out.append(atom if _SAFE_CLASS.fullmatch(atom) and _ranges_alnum(atom) else f"[{atom}&&{CHAR}]")
        elif c == ".":
            out.append(CHAR)
        elif c == '"':
            out.append('(?:\\\\")')
        elif c in "^$" and boundary and _at_boundary(pattern, i, c):
            continue  # the whole text is matched: an anchor at an alternative's end holds already
        elif c in "^$":
            refuse("pattern", where, f"an anchor {c} inside the pattern (only at the ends of its alternatives)")
        elif ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F:
            refuse("pattern", where, f"the control character {c!r}")
        else:
            out.append(c)
    return "".join(out)


def _at_boundary(pattern: str, i: int, c: str) -> bool:
    """Whether the anchor ``c`` at ``pattern[i]`` opens (``^``) or closes (``$``) a top-level alternative."""
    depth, starts, ends = 0, {0}, {len(pattern) - 1}
    for j, atom in regex_atoms(pattern):
        if atom in ("(", ")"):
            depth += 1 if atom == "(" else -1
        elif atom == "|" and depth == 0:
            starts.add(j + 1)
            ends.add(j - 1)
    return i in (starts if c == "^" else ends)


_SAFE_CLASS = re.compile(r"\[(?:[A-Za-z0-9](?:-[A-Za-z0-9])?|[_. ]|\\[.-])*-?\]")  # JSON-safe as it is


def _ranges_alnum(atom: str) -> bool:
    """Whether each range ``x-y`` of a class stays within the digits, the capitals or the small letters."""
    return all(a <= b and any(a in k and b in k for k in ("0123456789", "ABCDEFGHIJKLMNOPQRSTUVWXYZ",
                                                           "abcdefghijklmnopqrstuvwxyz"))
               for a, b in re.findall(r"(?<!\\)([A-Za-z0-9])-([A-Za-z0-9])", atom))


def _escape(e: str, atom: str, where: str) -> str:
    if e in ("d", "w"):
        return "\\" + e
    if e == "s":
        return " "
    if e in ("D", "W", "S"):
        return f"[\\{e}&&{CHAR}]"
    if e in ("p", "P") and len(atom) > 2:
        return f"[{atom}&&{CHAR}]"
    if e == "\\":  # each spelled as its JSON escape, grouped for a quantifier after it
        return "(?:\\\\\\\\)"
    if e == '"':
        return '(?:\\\\")'
    if e in ("n", "t", "r"):
        return f"(?:\\\\{e})"
    if e and not e.isalnum():
        return "\\" + e
    refuse("pattern", where, f"the escape \\{e} is not supported inside a JSON string")
