"""``oneOf`` as a union of branches no value validates against twice (docs/decoding.md "JSON Schema"):
branches proven disjoint as they are (other types, enums apart, a required property of distinct values, a
property one requires and the other forbids), or made so by writing a subset of one (a property the other
requires left out of it; an enum's strings left out of a string branch). What cannot be told apart is
refused, naming ``oneOf`` and its path."""

from __future__ import annotations

from .merge import TYPES, intersect_types, json_type, merge, refuse, search, types_of
from .strings import STRING_KEYWORDS

NUMERIC = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf")
_IMPLIED = {"string": STRING_KEYWORDS, "number": NUMERIC,
            "array": ("items", "prefixItems", "minItems", "maxItems", "uniqueItems", "contains"),
            "object": ("properties", "required", "additionalProperties", "minProperties", "maxProperties",
                       "patternProperties", "propertyNames", "dependentRequired", "dependentSchemas")}


def node_types(flat: dict) -> list[str]:
    """The types a flat node writes: its ``type`` (number covering integer), or the types its keywords are
    about, or all."""
    if "type" in flat:
        t = types_of(flat)
    else:
        t = {k for k, keys in _IMPLIED.items() if any(x in flat for x in keys)} or set(TYPES)
    if "number" in t:
        t.discard("integer")
    return [x for x in ("object", "array", "string", "integer", "number", "boolean", "null") if x in t]


def separate(w, options: list[dict], where: str) -> list[dict]:
    """Each of ``options`` (flat branches) narrowed until no value it lets through validates against another
    branch as given (exactly one then matches each value written), or a :class:`UserError`."""
    out = []
    for i, x in enumerate(options):
        for j, y in enumerate(options):
            if i == j or disjoint(w, x, y, where):
                continue
            x = _narrowed(w, x, y, where)
            if not disjoint(w, x, y, where):
                refuse("oneOf", where, f"its branches {i} and {j} may overlap (exactly one must match); make them "
                                       f"disjoint (other types, or a required property of distinct consts) or use "
                                       f"anyOf")
        out.append(x)
    return out


def _written_types(node: dict) -> set[str]:
    if "enum" in node:
        return {json_type(v, integers=True) for v in node["enum"]}
    if "type" in node:
        return types_of(node)
    if node.get("_unions"):
        return set(TYPES)
    return set(node_types(node))


def disjoint(w, a: dict, b: dict, where: str) -> bool:
    """Whether no value that ``a`` writes validates against ``b`` (a sufficient check)."""
    common = intersect_types(_written_types(a), _written_types(b))
    if not common:
        return True
    if "enum" in a or "enum" in b:
        values, other = (a["enum"], b) if "enum" in a else (b["enum"], a)
        return not any(all(w.valid(v, r) for r in _own(other)) for v in values)
    if common != {"object"}:
        return False
    return _told_apart(w, a, b, where) or _told_apart(w, b, a, where)


def _told_apart(w, a: dict, b: dict, where: str) -> bool:
    """A property ``a`` requires that ``b`` forbids, or requires too with distinct values; or ``a`` writes at
    least one property and only properties ``b`` forbids."""
    if a.get("minProperties", 0) >= 1 and _closed(a) and all(_forbids(b, n, where) for n in a.get("properties", {})):
        return True
    for name in a.get("required", []):
        if _forbids(b, name, where):
            return True
        if name in b.get("required", []):
            va, vb = _values(w, a, name, where), _values(w, b, name, where)
            if va is not None and vb is not None and not {_k(v) for v in va} & {_k(v) for v in vb}:
                return True
    return False


def _forbids(node: dict, name: str, where: str) -> bool:
    props = node.get("properties", {})
    if props.get(name) is False:
        return True
    return name not in props and node.get("additionalProperties") is False and not any(
        search(p, name, where) is not False for p in node.get("patternProperties", {}))


def _own(node: dict) -> list:
    """The raw schemas of a branch itself (not the node the oneOf is in, which holds the oneOf)."""
    return node.get("_branch", node.get("_raw", []))


def _closed(node: dict) -> bool:
    """Whether an object of ``node`` has its declared properties only."""
    return node.get("additionalProperties") is False and not node.get("patternProperties")


def _values(w, node: dict, name: str, where: str) -> list | None:
    sub = node.get("properties", {}).get(name)
    if not isinstance(sub, dict):
        return None
    flat = w.flatten(sub, where)
    return flat["enum"] if "enum" in flat and not flat.get("_unions") else None


def _k(v) -> str:
    import json

    return json.dumps(v, sort_keys=True) + type(v).__name__[:1]


def _narrowed(w, x: dict, y: dict, where: str) -> dict:
    """``x`` narrowed so that nothing it lets through validates against ``y``, where a rule applies: an enum
    loses the values ``y`` accepts; strings lose ``y``'s enum; an object that ``y`` would take writes a key
    ``y`` forbids, leaves out a key ``y`` requires, or (closed, all its keys forbidden by ``y``) at least one."""
    if "enum" in x:
        return dict(x, enum=[v for v in x["enum"] if not all(w.valid(v, r) for r in _own(y))])
    common = intersect_types(_written_types(x), _written_types(y))
    if common == {"string"} and "enum" in y:
        out = {"not": {"enum": [v for v in y["enum"] if isinstance(v, str)]}}
        return dict(x, _raw=list(x.get("_raw", [])) + [out], _branch=_own(x) + [out])
    if common != {"object"}:
        return x
    props = x.get("properties", {})
    if _closed(x) and props and all(_forbids(y, n, where) for n in props):
        return merge(x, {"minProperties": 1}, where)  # every object it writes then has a key y forbids
    for name in y.get("required", []):
        if name not in x.get("required", []):
            return merge(x, {"properties": {name: False}}, where)
    for name, sub in props.items():
        if sub is not False and _forbids(y, name, where):
            return merge(x, {"required": [name]}, where)
    return x
