"""A JSON Schema's keywords brought to one flat node before its regular expression is written
(docs/decoding.md "JSON Schema"): the spellings of drafts 4 to 2020-12 read alike, ``$ref`` and ``allOf``
merged into the node (the intersection of their keywords), ``if``/``then``/``else``, ``not`` and
``dependentSchemas`` turned into unions, and what no merge can express refused naming keyword and path.

A flat node holds validation keywords only, plus three of its own: ``_unions`` (``(kind, branches,
where)``: an ``anyOf``/``oneOf`` still to distribute, branches as raw subschemas), ``_raw`` (the raw
schemas it is the intersection of: an enum's values are kept only where they validate against all of
them) and ``_refs`` (the references followed to it)."""

from __future__ import annotations

import json
import re
from typing import NoReturn

from ....errors import UserError

ANNOTATION_ONLY = {"$defs", "definitions", "$id", "id", "$schema", "$anchor", "$dynamicAnchor", "$vocabulary",
                   "$comment", "title", "description", "default", "examples", "deprecated", "readOnly", "writeOnly",
                   "contentMediaType", "contentEncoding", "contentSchema", "discriminator"}
KEYWORDS = {"type", "enum", "const", "multipleOf", "maximum", "exclusiveMaximum", "minimum", "exclusiveMinimum",
            "maxLength", "minLength", "pattern", "format", "items", "prefixItems", "additionalItems", "maxItems",
            "minItems", "uniqueItems", "contains", "minContains", "maxContains", "properties", "patternProperties",
            "additionalProperties", "required", "maxProperties", "minProperties", "propertyNames", "dependencies",
            "dependentRequired", "dependentSchemas", "allOf", "anyOf", "oneOf", "not", "if", "then", "else", "$ref",
            "unevaluatedProperties", "unevaluatedItems", "$dynamicRef", "$recursiveRef"}
TYPES = ("null", "boolean", "object", "array", "number", "string")  # integer is a kind of number
_LOWER = ("minLength", "minItems", "minProperties", "minContains")
_UPPER = ("maxLength", "maxItems", "maxProperties", "maxContains")
MAX_BRANCHES = 64  # branches of one union after merging


class Unsatisfiable(Exception):
    """No value is written for this (sub)schema: dropped where it is one of several options, refused
    (naming ``key`` and ``where``) where it is needed."""

    def __init__(self, key: str, where: str, why: str):
        super().__init__(why)
        self.key, self.where, self.why = key, where, why

    def error(self) -> UserError:
        return UserError(f"json_schema: {self.key!r} at {self.where}: no value can be written: {self.why}",
                         fields=("json_schema",))


def refuse(key: str, where: str, why: str) -> NoReturn:
    raise UserError(f"json_schema: {key!r} at {where} cannot be enforced by the token automaton: {why}",
                    fields=("json_schema",))


def normalize(node, where: str) -> dict:
    """``node`` (a dict) with its validation keywords only, in the spelling of 2020-12: a boolean
    ``exclusiveMinimum``/``exclusiveMaximum`` (draft 4) as the bound, ``items`` as a list (drafts 4-2019)
    as ``prefixItems`` with ``additionalItems`` as ``items``, ``dependencies`` split into
    ``dependentRequired`` and ``dependentSchemas``, ``const`` as a one-value ``enum``."""
    out = {k: v for k, v in node.items() if k in KEYWORDS}
    for key, bound in (("exclusiveMinimum", "minimum"), ("exclusiveMaximum", "maximum")):
        if isinstance(out.get(key), bool):
            if out.pop(key) and bound in out:
                out[key] = out.pop(bound)
    if isinstance(out.get("items"), list):
        out["prefixItems"] = out.pop("items")
        if "additionalItems" in out:
            out["items"] = out.pop("additionalItems")
    out.pop("additionalItems", None)  # without a list of items it applies to nothing
    deps = out.pop("dependencies", None)
    if isinstance(deps, dict):
        for k, v in deps.items():
            kind = "dependentRequired" if isinstance(v, list) else "dependentSchemas"
            out.setdefault(kind, {})[k] = v
    if "const" in out:
        values = [out.pop("const")]
        out["enum"] = _common(values, out["enum"]) if "enum" in out else values
    for key in ("unevaluatedProperties", "unevaluatedItems", "$dynamicRef", "$recursiveRef"):
        if key in out:
            refuse(key, where, "it depends on what the other subschemas evaluated; write additionalProperties / "
                               "items instead")
    return out


def _common(a: list, b: list) -> list:
    keys = {_key(v) for v in b}
    return [v for v in a if _key(v) in keys]


def _key(value) -> str:
    """JSON equality (1 == 1.0, but true != 1) as a string."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return json.dumps(value, sort_keys=True) + ("b" if isinstance(value, bool) else "")


def types_of(node: dict) -> set[str]:
    """The JSON types ``node`` lets through by its ``type`` (all of them without one); ``integer`` stands
    for the integral numbers."""
    t = node.get("type")
    if t is None:
        return set(TYPES)
    return {t} if isinstance(t, str) else set(t)


def intersect_types(a: set[str], b: set[str]) -> set[str]:
    out = a & b
    if "integer" in a and "number" in b or "integer" in b and "number" in a:
        out.add("integer")
    if "integer" in out and "number" in out:
        out.discard("integer")
        if not ("number" in a and "number" in b):
            out.discard("number")
            out.add("integer")
    return out


def merge(a: dict, b: dict, where: str) -> dict:
    """The flat node validating exactly the values that validate against both ``a`` and ``b`` (flat nodes),
    or a :class:`UserError` naming the keyword whose intersection cannot be written."""
    out = dict(a)
    for key, v in b.items():
        if key not in out:
            out[key] = v
            continue
        mine = out[key]
        if key == "type":
            out[key] = sorted(intersect_types(types_of(a), types_of(b)))
        elif key == "enum":
            out[key] = _common(mine, v)
        elif key in ("minimum", "exclusiveMinimum") + _LOWER:
            out[key] = max(mine, v)
        elif key in ("maximum", "exclusiveMaximum") + _UPPER:
            out[key] = min(mine, v)
        elif key in ("_raw", "_unions"):
            out[key] = list(mine) + list(v)
        elif key in ("required", "_refs"):
            out[key] = list(mine) + [x for x in v if x not in mine]
        elif key == "uniqueItems":
            out[key] = bool(mine) or bool(v)
        elif key in ("items", "additionalProperties", "propertyNames", "contains"):
            out[key] = both(mine, v)
        elif key in ("properties", "patternProperties", "dependentSchemas"):
            out[key] = {**mine, **{k: both(mine[k], s) if k in mine else s for k, s in v.items()}}
        elif key == "dependentRequired":
            out[key] = {**mine, **{k: list(dict.fromkeys(list(mine.get(k, [])) + list(s))) for k, s in v.items()}}
        elif key == "prefixItems":
            n = max(len(mine), len(v))
            out[key] = [both(_at(mine, i, a), _at(v, i, b)) for i in range(n)]
        elif _key(mine) != _key(v):
            refuse(key, where, f"two subschemas merged here (allOf, $ref) give it different values ({mine!r} and "
                               f"{v!r}), "
                               f"and their intersection is not written; give it once")
    _merge_objects(out, a, b, where)
    return out


def both(x, y):
    """The raw schema of the values valid against ``x`` and ``y`` (raw schemas)."""
    if x is True or x == {}:
        return y
    if y is True or y == {}:
        return x
    return {"allOf": [x, y]}


def _at(prefix: list, i: int, node: dict):
    return prefix[i] if i < len(prefix) else node.get("items", True)


def _merge_objects(out: dict, a: dict, b: dict, where: str) -> None:
    """A property one side declares and the other does not is checked by the other's
    ``additionalProperties`` (when no pattern of the other may match it); a pattern of one side by the
    other's ``additionalProperties`` too: the merged node keeps both checks."""
    if "properties" not in out and "patternProperties" not in out:
        return
    props, pats = dict(out.get("properties", {})), dict(out.get("patternProperties", {}))
    for mine, other in ((a, b), (b, a)):
        extra = other.get("additionalProperties", True)
        if extra is True:
            continue
        for name in mine.get("properties", {}):
            if name not in other.get("properties", {}) and not any(
                    _may_match(p, name, where) for p in other.get("patternProperties", {})):
                props[name] = both(props[name], extra)
        for pat in mine.get("patternProperties", {}):
            if pat not in other.get("patternProperties", {}):
                pats[pat] = both(pats[pat], extra)
    if props:
        out["properties"] = props
    if pats:
        out["patternProperties"] = pats


def _may_match(pattern: str, name: str, where: str) -> bool:
    """Whether ``pattern`` matches ``name``; a pattern Python cannot read counts as no match, so the other side's
    ``additionalProperties`` still checks the property (the stricter merge)."""
    return search(pattern, name, where) is True


def search(pattern: str, name: str, where: str) -> bool | None:
    """Whether ``pattern`` (ECMA-262, read by Python's ``re``) finds a match in ``name``; None where Python
    cannot read it."""
    try:
        return re.search(pattern, name) is not None
    except (re.error, RecursionError):
        return None


def alt(parts: list[str]) -> str:
    """The alternation of regexes ``parts`` (one part: itself)."""
    return parts[0] if len(parts) == 1 else "|".join(f"(?:{p})" for p in parts)


def negate(node, where: str) -> list:
    """Raw schemas whose union is a subset of the values ``node`` (a raw schema, references followed by
    the caller) rejects: the other types, the other values of an ``enum`` over strings and booleans, a
    property's value negated, a required property absent, the other side of a bound. What has no written
    complement here contributes nothing (a subset is what every output needs)."""
    if node is True or node == {}:
        return []
    if node is False:
        return [True]
    if not isinstance(node, dict):
        return []
    n = normalize(node, where)
    out: list = []
    if "type" in n:
        t = types_of(n)
        out.append({"type": [x for x in TYPES if x not in t and not (x == "number" and "integer" in t)]})
    if "enum" in n:
        values = n["enum"]
        out += [{"type": t} for t in ("null", "boolean", "object", "array", "number", "string")
                if not any(json_type(v) == t for v in values)]
        if any(json_type(v) == "string" for v in values):
            out.append({"type": "string", "not": {"enum": [v for v in values if isinstance(v, str)]}})
        if any(isinstance(v, bool) for v in values):
            out += [{"enum": [x]} for x in (True, False) if x not in values]
    for name in n.get("required", []):
        out.append({"type": "object", "properties": {name: False}})
    for name, sub in (n.get("properties") or {}).items():
        out += [{"type": "object", "required": [name], "properties": {name: s}} for s in negate(sub, where)]
    for key, other, kind in (("minimum", "exclusiveMaximum", "number"), ("exclusiveMinimum", "maximum", "number"),
                             ("maximum", "exclusiveMinimum", "number"), ("exclusiveMaximum", "minimum", "number"),
                             ("minLength", "maxLength", "string"), ("maxLength", "minLength", "string"),
                             ("minItems", "maxItems", "array"), ("maxItems", "minItems", "array")):
        if isinstance(n.get(key), (int, float)):
            v = n[key] if not key.startswith(("minL", "maxL", "minI", "maxI")) else \
                n[key] - 1 if key.startswith("min") else n[key] + 1
            if v >= 0 or kind == "number":
                out.append({"type": kind, other: v})
    return [s for s in out if not (isinstance(s, dict) and s.get("type") == [])]


def json_type(v, integers: bool = False) -> str:
    """The JSON type of a Python value (``integer`` for an integral number when ``integers``)."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, (int, float)):
        return "integer" if integers and (isinstance(v, int) or v.is_integer()) else "number"
    names: dict[type, str] = {str: "string", list: "array", dict: "object"}
    return names[type(v)]


def excluded(raw) -> list:
    """The values a raw schema's ``not: {"enum": [...]}`` (or ``const``) excludes; [] for any other ``not``."""
    sub = raw.get("not") if isinstance(raw, dict) else None
    if not isinstance(sub, dict) or not sub or not set(sub) - ANNOTATION_ONLY <= {"enum", "const"} or \
            not set(sub) & {"enum", "const"}:
        return []
    return list(sub.get("enum", [])) + ([sub["const"]] if "const" in sub else [])


def not_strings(node: dict) -> list[str]:
    """The strings a flat node's ``not`` of values excludes."""
    return [v for raw in node.get("_raw", []) for v in excluded(raw) if isinstance(v, str)]
