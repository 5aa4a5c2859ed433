"""Objects and arrays of a JSON Schema as regular expressions (docs/decoding.md "JSON Schema"), written by
:class:`setdlm.decoding.structured.schema.regex.Writer` for a flat node
(:mod:`setdlm.decoding.structured.schema.merge`)."""

from __future__ import annotations

import json

from .merge import Unsatisfiable, alt, both, merge, refuse, search
from .strings import except_strings, json_literal, key_regex, literal

SCALAR = {"type": ["string", "number", "boolean", "null"]}  # a required name nothing declares
MAX_DEPENDENCIES = 3  # optional keys with dependencies written both ways (the others are left out)


def sequence(groups: list[tuple[str, bool]], sep: str) -> str:
    """The regex of the members of ``groups`` (regex, required) in their order joined by ``sep``, each
    optional one present or not: linear in the groups (with one required, ``(a,)?(b,)?r(,c)?``; with none,
    ``N_i = (g_i,)?N_{i+1} | g_i``), empty allowed only when none is required."""
    if not groups:
        return ""
    first = next((i for i, (_, req) in enumerate(groups) if req), None)
    if first is None:
        n = groups[-1][0]
        for g, _ in reversed(groups[:-1]):
            n = f"(?:{g}{sep})?(?:{n})|{g}"
        return f"(?:{n})?"
    pre = "".join(f"(?:{g}{sep})?" for g, _ in groups[:first])
    post = "".join(f"{sep}{g}" if req else f"(?:{sep}{g})?" for g, req in groups[first + 1:])
    return f"{pre}{groups[first][0]}{post}"


def object_regex(w, flat: dict, where: str) -> str:
    deps = list(dict.fromkeys(list(flat.get("dependentRequired", {})) + list(flat.get("dependentSchemas", {}))))
    if deps:
        return _dependencies(w, flat, deps, where)
    props = dict(flat.get("properties", {}))
    pats = flat.get("patternProperties", {})
    extra = flat.get("additionalProperties")
    names = flat.get("propertyNames")
    required = list(dict.fromkeys(flat.get("required", [])))
    if not props and not pats and extra is None and names is None:
        extra = True  # a free-form object
    ws = w.ws
    groups: list[list] = []
    for name in list(props) + [r for r in required if r not in props]:
        need = name in required
        try:
            v = w.value(_property_schema(w, flat, name, where), f"{where}/properties/{name}")
        except Unsatisfiable:
            if need:
                raise
            continue
        groups.append([f"{ws}{literal(json.dumps(name, ensure_ascii=False))}{ws}:{ws}(?:{v})", need])
    dynamic = _dynamic(w, flat, list(props) + required, extra, where)
    return _body(flat, groups, dynamic, ws, where)


def _property_schema(w, flat: dict, name: str, where: str):
    """The raw schema of a declared (or required) property: its own, and every pattern's that may match its
    name; a required name nothing declares takes ``additionalProperties`` (a scalar when that is absent)."""
    props, pats = flat.get("properties", {}), flat.get("patternProperties", {})
    extra = flat.get("additionalProperties")
    matching = [s for p, s in pats.items() if search(p, name, where) is not False]
    sub = props.get(name)
    if sub is None:
        if matching:
            sub = True
        elif extra is False:
            raise Unsatisfiable("required", where, f"{name!r} is required but additionalProperties is false and it "
                                               f"is in neither properties nor patternProperties")
        else:
            sub = SCALAR if extra in (None, True) else extra
    for s in matching:
        sub = both(sub, s)
    names = flat.get("propertyNames")
    if names is not None and not w.valid(name, names):
        raise Unsatisfiable("propertyNames", where, f"{name!r} is not a valid property name")
    return sub


def _dynamic(w, flat: dict, declared: list[str], extra, where: str) -> str | None:
    """The regex of one property whose name is not declared: a name a pattern finds (when no declared name
    may be one of them) or, without patterns, any name but the declared ones (``propertyNames``' strings
    when given, if no declared name is one of them); None when no such property is written."""
    ws, pats, names = w.ws, flat.get("patternProperties", {}), flat.get("propertyNames")
    out = []
    if names is None:
        for p, s in pats.items():
            if any(search(p, n, where) is not False for n in declared):
                continue  # it might write a declared name twice
            others = [s2 for p2, s2 in pats.items() if p2 != p and _may_overlap(p, p2)]
            sub = s
            for s2 in others:
                sub = both(sub, s2)
            try:
                v = w.value(sub, f"{where}/patternProperties/{p}")
            except Unsatisfiable:
                continue
            out.append(f"{ws}{key_regex(p, where)}{ws}:{ws}(?:{v})")
    if extra not in (None, False) and not pats:
        try:
            v = w.value(extra, f"{where}/additionalProperties")
        except Unsatisfiable:
            v = None
        if v is not None and names is None:
            out.append(f"{ws}{except_strings(declared)}{ws}:{ws}(?:{v})")
        elif v is not None and not any(w.valid(n, names) for n in declared):
            try:
                key = w.value(both(names, {"type": "string"}), f"{where}/propertyNames")
                out.append(f"{ws}(?:{key}){ws}:{ws}(?:{v})")
            except Unsatisfiable:
                pass
    return "|".join(f"(?:{o})" for o in out) or None


def _may_overlap(p: str, q: str) -> bool:
    """Whether two patterns may find a match in the same name (False only for distinct anchored literal
    prefixes)."""
    def prefix(x: str) -> str | None:
        if not x.startswith("^"):
            return None
        out = ""
        for c in x[1:]:
            if not (c.isalnum() or c in "_-/:@"):
                break
            out += c
        return out

    a, b = prefix(p), prefix(q)
    return a is None or b is None or a.startswith(b) or b.startswith(a)


def _body(flat: dict, groups: list[list], dynamic: str | None, ws: str, where: str) -> str:
    """``\\{ ... \\}`` of the declared ``groups`` and repeated ``dynamic`` properties within
    ``minProperties``/``maxProperties``: the first optional properties made required up to the minimum,
    the last left out past the maximum."""
    lo, hi = flat.get("minProperties", 0), flat.get("maxProperties")
    need = sum(req for _, req in groups)
    for g in groups:
        if need >= lo:
            break
        if not g[1]:
            g[1], need = True, need + 1
    reps = max(lo - need, 0)
    if reps and dynamic is None:
        raise Unsatisfiable("minProperties", where, f"{lo} properties are needed but only {need} can be written")
    if hi is not None:
        if need + reps > hi:
            raise Unsatisfiable("maxProperties", where, f"{need} properties are required, more than {hi}")
        room = hi - need
        kept = []
        for g in groups:
            if g[1] or room > 0:
                kept.append(g)
                room -= not g[1]
        groups = kept
        if room <= 0:
            dynamic = None
    sep = f"{ws},"
    parts = [(g, req) for g, req in groups]
    if dynamic is not None:
        top = "" if hi is None else max(room - 1, 0)
        parts.append((f"(?:{dynamic})(?:{sep}(?:{dynamic})){{{max(reps - 1, 0)},{top}}}", reps > 0))
    return f"\\{{{sequence(parts, sep)}{ws}\\}}"


def _dependencies(w, flat: dict, deps: list[str], where: str) -> str:
    """An object with ``dependentRequired``/``dependentSchemas``: for its first key, the union of the
    objects without it and those with it and what it needs (only the latter where it is required; only
    the former past :data:`MAX_DEPENDENCIES` optional keys)."""
    key, rest = deps[0], dict(flat)
    rest["dependentRequired"] = {k: v for k, v in flat.get("dependentRequired", {}).items() if k != key}
    rest["dependentSchemas"] = {k: v for k, v in flat.get("dependentSchemas", {}).items() if k != key}
    for k in ("dependentRequired", "dependentSchemas"):
        if not rest[k]:
            del rest[k]
    with_key = merge(rest, {"required": [key] + list(flat.get("dependentRequired", {}).get(key, []))}, where)
    if key in flat.get("dependentSchemas", {}):
        with_key = merge(with_key, w.flatten(flat["dependentSchemas"][key], f"{where}/dependentSchemas/{key}"), where)
    without = merge(rest, {"properties": {key: False}}, where)
    options = [with_key] if key in flat.get("required", []) else \
        [without, with_key] if len(deps) <= MAX_DEPENDENCIES else [without]
    out: list[str] = []
    failed: list[Unsatisfiable] = []
    for option in options:
        try:
            out.append(w.written(option, where))
        except Unsatisfiable as e:
            failed.append(e)
    if not out:  # every option failed (there is at least one): the first one's reason
        raise failed[0]
    return alt(out)


def array_regex(w, flat: dict, where: str) -> str:
    prefix, items = list(flat.get("prefixItems", [])), flat.get("items", True)
    lo, hi = flat.get("minItems", 0), flat.get("maxItems")
    if "contains" in flat:
        prefix, lo = _contains(flat, prefix, items, lo, hi, where)
    if flat.get("uniqueItems") and (hi is None or hi > 1):
        return _unique(w, flat, prefix, items, lo, hi, where)
    ws = w.ws
    sep = f"{ws},{ws}"
    elems = []
    for i, s in enumerate(prefix):
        try:
            elems.append(w.value(s, f"{where}/prefixItems/{i}"))
        except Unsatisfiable:
            hi = i if hi is None else min(hi, i)
            break
    rest = None
    if hi is None or hi > len(elems):
        try:
            rest = w.value(items, f"{where}/items")
        except Unsatisfiable:
            hi = len(elems) if hi is None else min(hi, len(elems))
    if hi is not None and lo > hi:
        raise Unsatisfiable("minItems", where, f"at least {lo} items are needed, at most {hi} can be written")
    k = len(elems) if hi is None else min(len(elems), hi)
    tail = ""
    if rest is not None and (hi is None or hi > k):
        a, b = max(lo - k, 0), None if hi is None else hi - k
        if k:
            tail = f"(?:{sep}(?:{rest})){{{a},{'' if b is None else b}}}"
        else:
            tail = f"(?:{rest})(?:{sep}(?:{rest})){{{max(a - 1, 0)},{'' if b is None else b - 1}}}"
            tail = tail if a else f"(?:{tail})?"
    body = tail
    for i in range(k - 1, -1, -1):
        body = f"{sep if i else ''}(?:{elems[i]}){body}"
        if i >= lo:
            body = f"(?:{body})?"
    return f"\\[{ws}{body}{ws}\\]"


def _contains(flat: dict, prefix: list, items, lo: int, hi, where: str) -> tuple[list, int]:
    """``contains`` (at least ``minContains`` items valid against it) by making the first that many items
    valid against it."""
    n = flat.get("minContains", 1)
    if "maxContains" in flat:
        refuse("maxContains", where, "at most so many items valid against contains is not written here")
    if flat.get("uniqueItems"):
        refuse("contains", where, "contains together with uniqueItems")
    prefix = prefix + [items] * max(n - len(prefix), 0)
    return [both(s, flat["contains"]) if i < n else s for i, s in enumerate(prefix)], max(lo, n)


def _unique(w, flat: dict, prefix: list, items, lo: int, hi, where: str) -> str:
    """``uniqueItems`` where the items are a finite set (an enum, const, boolean or null): each value at
    most once, in the enum's order, the first ``minItems`` of them always."""
    if prefix:
        refuse("uniqueItems", where, "uniqueItems with prefixItems (or items as a list) is not written here")
    sub = w.flatten(items, f"{where}/items") if isinstance(items, dict) else None
    values: list | None = None
    if sub is not None and not sub.get("_unions"):
        only_type = set(sub) <= {"type", "_raw", "_refs", "_unions"}
        if "enum" in sub:
            values = w.enum_values(sub, f"{where}/items")
        elif sub.get("type") in ("boolean", ["boolean"]) and only_type:
            values = [True, False]
        elif sub.get("type") in ("null", ["null"]) and only_type:
            values = [None]
    if values is None:
        refuse("uniqueItems", where, "the items are not a finite set of values (enum, const, boolean): distinct "
                                     "free values are not a regular language; give the items an enum")
    values = values[:hi] if hi is not None else values
    if len(values) < lo:
        raise Unsatisfiable("minItems", where, f"{lo} distinct items are needed, the items have {len(values)} values")
    ws = w.ws
    return f"\\[{ws}{sequence([(json_literal(v, ws), i < lo) for i, v in enumerate(values)], f'{ws},{ws}')}{ws}\\]"
